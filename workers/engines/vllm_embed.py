"""vLLM embedding engine: the pooling runner, one engine request per input.

Part of the vLLM engine (vllm.py). Every input of a job is its own request to
AsyncLLM.encode, so vLLM's scheduler packs the inputs of all jobs in flight into its
steps; the job ends when its last input has its vector. The result is what the
llama.cpp embedding engine gives: one L2-normalised float32 vector per input, base64,
as JSON in the job's `output`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from tokenq.shared.settings import ModelConfig
from tokenq.workers.engines.base import EngineRequest, Finished
from tokenq.workers.engines.vllm import VllmEngine

log = logging.getLogger(__name__)


class VllmEmbedEngine(VllmEngine):
    def __init__(self, cfg: ModelConfig, model_dir: Path):
        # An encoder-only model has no KV cache to share (vLLM's server turns it off too).
        super().__init__(cfg.model_copy(update={"enable_prefix_caching": False}), model_dir)
        self.extra_args = {"runner": "pooling"}

    async def _run(self, req: EngineRequest) -> None:
        job, attempt = req.job_id, req.attempt
        n_tokens = 0

        def end(reason: Any, code: str | None = None, msg: str | None = None,
                output: str | None = None) -> None:
            self._emit([], Finished(job, attempt, reason, n_tokens, 0, code, msg, output))

        try:
            ids = [list(self.tokenizer.encode(t)) for t in req.inputs or []]
            n_tokens = sum(len(x) for x in ids)
            if not ids or any(not x or len(x) > self.max_model_len for x in ids):
                return end("error", "context_length_exceeded",
                           f"every input must have 1 to {self.max_model_len} tokens")
            vectors = await asyncio.gather(*(self._embed(f"{job}:{attempt}:{i}", x)
                                             for i, x in enumerate(ids)))
            return end("stop", output=json.dumps(vectors))
        except asyncio.CancelledError:
            return end("cancelled")
        except Exception as exc:
            if self.llm is not None and self.llm.errored:
                self._dead = True
                log.exception("job %s: the vLLM engine failed", job)
                return None
            log.exception("job %s: vLLM rejected or failed the request", job)
            return end("error", "bad_request", f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(job, None)

    async def _embed(self, request_id: str, ids: list[int]) -> str:
        from vllm.inputs import TokensPrompt
        from vllm.pooling_params import PoolingParams

        last: Any = None
        async for out in self.llm.encode(TokensPrompt(prompt_token_ids=ids),
                                         PoolingParams(task="embed"), request_id=request_id):
            last = out
        vec = np.asarray(last.outputs.data.float().cpu().numpy(), dtype=np.float32).ravel()
        vec /= max(float(np.linalg.norm(vec)), 1e-12)
        return base64.b64encode(vec.tobytes()).decode()
