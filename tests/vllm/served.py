"""vLLM's own OpenAI server as a test peer: started, awaited on /health, stopped."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def vllm_server(args: list[str], port: int, log_path: Path,
                env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `args` (a vLLM api_server command on `port`, with `env` on top of this process's
    and the engine's environment); yield its URL once it is healthy."""
    from tokenq.workers.engines.vllm_args import (
        engine_env,  # imports vLLM's settings: only when used
    )

    log = log_path.open("wb")
    proc = subprocess.Popen(args, env={**os.environ, **engine_env(), **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"vLLM's server did not start: {args}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
