"""How a worker process ends once it has stopped: `end_process` (workers/runtime.py) skips
the interpreter's teardown but keeps what matters of it (atexit hooks, flushed streams,
no child left behind), and the vLLM engine gives its
processes a short grace on a CPU (workers/engines/vllm_args.stop_grace_s)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest

from tokenq.shared.settings import ModelConfig
from tokenq.workers.engines import vllm_args
from tokenq.workers.engines.vllm import VllmEngine

SCRIPT = textwrap.dedent("""
    import atexit, logging, multiprocessing, os, sys, time
    from pathlib import Path
    from tokenq.workers.runtime import end_process

    def nap():
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # not the test's pipes: it reads them to their end
        os.dup2(devnull, 2)
        time.sleep(120)

    class Held:
        def __del__(self):  # the interpreter's teardown of a module's objects
            print("TEARDOWN RAN", flush=True)

    held = Held()

    if __name__ == "__main__":
        atexit.register(lambda: print("the atexit hook ran", flush=True))
        child = multiprocessing.Process(target=nap, daemon=False)
        child.start()
        Path(sys.argv[2]).write_text(str(child.pid))
        logging.basicConfig(stream=sys.stderr, level=logging.INFO)
        logging.getLogger("w").info("the last log line")
        sys.stdout.write("the last output, unflushed")
        end_process(eval(sys.argv[1]))
""")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie until init reaps it: gone too
        return f.read().split(") ")[-1].startswith("Z")


@pytest.mark.parametrize(("status", "code", "stderr"), [
    ("None", 0, ""), ("0", 0, ""), ("3", 3, ""),
    ("'worker for m: its engine died; exiting'", 1, "its engine died")])
def test_end_process_exits_with_the_status_and_skips_only_the_teardown(
        tmp_path: Path, status: str, code: int, stderr: str) -> None:
    script, pid_file = tmp_path / "w.py", tmp_path / "child.pid"
    script.write_text(SCRIPT)
    # A non-daemon child would keep a normal exit waiting 120 s in multiprocessing's join.
    proc = subprocess.run([sys.executable, str(script), status, str(pid_file)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert "TEARDOWN RAN" not in proc.stdout  # the interpreter's teardown was skipped,
    assert proc.stdout == "the last output, unflushedthe atexit hook ran\n"  # not atexit
    assert "the last log line" in proc.stderr and stderr in proc.stderr
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not gone(child):  # killed, not left behind
        assert time.monotonic() < deadline, "the child process was left running"
        time.sleep(0.05)


def stopped_with(monkeypatch: pytest.MonkeyPatch, gpu: bool) -> mock.Mock:
    monkeypatch.setattr(vllm_args, "has_nvidia_gpu", lambda: gpu)
    engine = VllmEngine(ModelConfig(backend="vllm", source="hf", path="/nowhere"),
                        Path("/nowhere"))
    engine.llm = llm = mock.Mock()
    asyncio.run(engine._shutdown())
    return llm


def test_a_cpu_engines_processes_get_a_short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = stopped_with(monkeypatch, gpu=False)
    llm.shutdown.assert_called_once_with(timeout=vllm_args.CPU_STOP_GRACE_S)
    assert vllm_args.CPU_STOP_GRACE_S < 5  # vLLM's own wait is 5 s


def test_a_gpu_engine_keeps_vllms_own_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = stopped_with(monkeypatch, gpu=True)
    llm.shutdown.assert_called_once_with(timeout=None)
