"""vLLM's engine processes die with the worker that started them (the vllm plugin)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

# A stand-in worker: starts a child the way vLLM starts EngineCore (multiprocessing), the
# child runs the plugin's hook as vLLM's processes do, then both wait to be killed.
WORKER = textwrap.dedent("""
    import multiprocessing, time

    def engine_core(ready):
        from tokenq.workers.engines.vllm_plugin import init_amx
        init_amx()
        ready.set()
        time.sleep(120)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        p = ctx.Process(target=engine_core, args=(ready,))
        p.start()
        ready.wait(60)
        print(p.pid, flush=True)
        time.sleep(120)
""")


def test_engine_process_exits_when_its_worker_is_sigkilled(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"  # spawn re-imports the main module: it must be a file
    script.write_text(WORKER)
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert worker.stdout is not None
        child = psutil.Process(int(worker.stdout.readline()))
        assert child.status() != psutil.STATUS_ZOMBIE
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 10
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the engine process outlived its worker"
            time.sleep(0.1)
    finally:
        worker.kill()


def test_the_worker_itself_is_left_alone() -> None:
    """vLLM loads its plugins in the worker's own process too: no signal is armed there
    (the worker's parent is `tokenq up` or a supervisor, which decides that itself)."""
    code = ("import ctypes; from tokenq.workers.engines.vllm_plugin import init_amx; init_amx(); "
            "sig = ctypes.c_int(-1); ctypes.CDLL('libc.so.6').prctl(2, ctypes.byref(sig)); "
            "print(sig.value)")  # 2 = PR_GET_PDEATHSIG
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "0"


def test_the_hook_is_found_by_the_processes_a_worker_starts(tmp_path: Path) -> None:
    """register() (the vLLM worker, before its engine starts) makes vLLM find tokenq's hook
    in that process and its children, through sys.path and PYTHONPATH; nowhere else."""
    import pytest

    pytest.importorskip("vllm")
    code = textwrap.dedent(f"""
        import os, subprocess, sys
        from pathlib import Path
        from tokenq.workers.engines.vllm_plugin import register
        register(Path({str(tmp_path)!r}))
        from vllm.plugins import load_plugins_by_group
        child = subprocess.run([sys.executable, "-c",
            "from vllm.plugins import load_plugins_by_group; "
            "print(sorted(load_plugins_by_group('vllm.general_plugins')))"],
            capture_output=True, text=True, check=True)
        print("tokenq" in load_plugins_by_group("vllm.general_plugins"),
              "'tokenq'" in child.stdout)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "True True", out.stdout
