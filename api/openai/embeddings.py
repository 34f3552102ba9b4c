"""/v1/embeddings on the queue: one job per request, its inputs batched by the engine.

The job's result is one base64 float32 vector per input (L2-normalised by the worker);
`encoding_format: float` decodes them here. Unknown fields are ignored with a warning
in the log, as on chat/completions. Batch API lines take the same body
(api/openai/batch_lines.py); their output lines' bodies are `body_json`'s.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Literal

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field, field_validator, model_validator

from tokenq.api import service
from tokenq.api.deps import AppState
from tokenq.api.errors import InvalidRequest
from tokenq.api.openai import serving
from tokenq.shared.jobs import dumps
from tokenq.shared.request_model import RequestModel
from tokenq.shared.schemas import (
    MAX_EMBED_INPUTS,
    JobRecord,
    JobRequest,
    Priority,
    no_empty_texts,
)

log = logging.getLogger(__name__)


class EmbeddingRequest(RequestModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    priority: Priority | None = None  # tokenq's

    @field_validator("input")
    @classmethod
    def _no_empty(cls, v: str | list[str]) -> str | list[str]:
        # an empty text would reach admission as a context-length error; a single empty
        # string is refused by min_length
        return no_empty_texts(v) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _inputs(self) -> EmbeddingRequest:
        if self.model_extra:
            log.warning("The following fields were present in the request but ignored: %s",
                        sorted(self.model_extra))
            self.model_extra.clear()
        if isinstance(self.input, list) and len(self.input) > MAX_EMBED_INPUTS:
            raise ValueError(f"input: at most {MAX_EMBED_INPUTS} texts per request")
        return self

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


# A result over this many bytes (base64 vectors: ~30 of 384 dimensions) is rendered on the
# CPU pool, in the tenant's share: 2,048 vectors as floats are 16 MB of JSON, which on the
# event loop stood every stream of the replica still ~1 s a response.
INLINE_OUTPUT_BYTES = 64 * 1024


async def create(state: AppState, tenant: str, body: EmbeddingRequest,
                 request: Request) -> Response:
    if body.dimensions is not None:
        await check_dimensions(state, body.model, body.dimensions)
    job = JobRequest(model=body.model, input=body.texts(), priority=body.priority or "normal")
    accepted = await service.submit(state, tenant, job,
                                    extra={"endpoint": "/v1/embeddings"})
    ((rec, _),) = await serving.await_all(state, tenant, [accepted.id], request, False)
    rec = serving.raise_for_state(rec)
    args = (rec, body.model, body.encoding_format)
    text = body_json(*args) if len(rec.output or "") <= INLINE_OUTPUT_BYTES else \
        await state.counter.pool.run(tenant, body_json, *args)
    return Response(text, media_type="application/json", headers={"X-Tokenq-Job-Id": rec.id})


def body_json(rec: JobRecord, model: str, encoding: str) -> str:
    """A succeeded job's response as JSON text (a batch output line's body too): its
    vectors as floats, or as the base64 the record keeps. Encoded a vector at a time: one
    json.dumps of 16 MB holds the GIL whole, and the loop with it, even from a thread."""
    vectors = json.loads(rec.output or "[]")
    n = rec.usage.prompt_tokens if rec.usage else 0
    head = dumps({"id": "embd-" + rec.id.removeprefix("job_"), "object": "list",
                  "created": int(rec.created_at), "model": model,
                  "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}})
    data = ",".join(dumps({"object": "embedding", "index": i, "embedding": v
                           if encoding == "base64" else
                           np.frombuffer(base64.b64decode(v), dtype=np.float32).tolist()})
                    for i, v in enumerate(vectors))
    return f'{head[:-1]},"data":[{data}]}}'


async def check_dimensions(state: AppState, model: str, dimensions: int | None) -> None:
    """No Matryoshka model is served: only the model's own size is accepted (vLLM answers
    a 400 the same way for a model that does not support matryoshka dimensions)."""
    cfg = state.models.get(model)
    vocab: Any = None
    if cfg is not None and cfg.embedding:
        try:
            vocab = await state.counter.exact(model, cfg)
        except LookupError:
            vocab = None
    size = getattr(vocab, "n_embd", None)
    if size != dimensions:
        raise InvalidRequest(f"dimensions: this model makes vectors of {size} dimensions and "
                             "does not support others", param="dimensions")
