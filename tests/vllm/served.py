"""vLLM's own OpenAI server as a test peer: started, awaited on /health, stopped.

A vLLM server takes ~45 s to boot on 2 cores, nearly all of it one Python process at a
time importing torch and vLLM (the server, then its engine, then the engine's worker). A
fixture that launches it and only waits for it when a test first asks for its URL lets
another boot (tokenq's own stack) run beside it, on the other core."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tokenq.cli.bench.peers import wait_http

BOOT_TIMEOUT_S = 300


class Launched:
    """`args` (a vLLM api_server command on `port`, with `env` on top of this process's and
    the engine's environment) started now; `url` waits until it is healthy."""

    def __init__(self, args: list[str], port: int, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        from tokenq.workers.engines.vllm_args import (
            engine_env,  # imports vLLM's settings: only when used
        )

        self._args, self._log_path = args, log_path
        self._log = log_path.open("wb")
        self._proc = subprocess.Popen(args, env={**os.environ, **engine_env(), **(env or {})},
                                      stdout=self._log, stderr=subprocess.STDOUT)
        self._url = f"http://127.0.0.1:{port}"
        self._deadline = time.monotonic() + BOOT_TIMEOUT_S
        self._healthy = False

    @property
    def url(self) -> str:
        if not self._healthy:
            try:
                wait_http(self._url + "/health", self._proc,
                          max(0.0, self._deadline - time.monotonic()))
            except (RuntimeError, TimeoutError) as exc:
                raise AssertionError(f"vLLM's server did not start ({exc}): {self._args}\n"
                                     + self._log_path.read_text()[-3000:]) from None
            self._healthy = True
        return self._url

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._log.close()

