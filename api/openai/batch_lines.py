"""A batch input line, checked: its custom_id and its request as a native job, or the
line's error (OpenAI's batch error shape: code, message, param). No I/O: a long line is
parsed on the CPU pool (api/openai/batch_driver.py).

Lines are chat or completion requests, or embeddings (`/v1/embeddings`, as on OpenAI: at
most MAX_BATCH_INPUTS inputs over the whole batch, which bounds what its records hold)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tokenq.api import surrogates
from tokenq.api.openai import protocol
from tokenq.api.openai.embeddings import EmbeddingRequest
from tokenq.shared.schemas import JobRequest

# Lines up to this long are parsed on the event loop (well under a millisecond); longer
# ones on the CPU pool: json.loads and validating a 1 MB line take tens of milliseconds.
INLINE_LINE_BYTES = 64 * 1024
MAX_PIPELINE = 256  # lines enqueued per round trip at most, whatever batch_chunk says
# Embedding inputs in one batch, all lines together (OpenAI's limit): ~2 KB of record a
# vector on a 384-dimension model, kept as long as the batch's output file.
MAX_BATCH_INPUTS = 50_000


def line_job_id(batch_id: str, line: int) -> str:
    return f"job_{batch_id.removeprefix('batch_')}_{line}"


@dataclass
class Parsed:
    """A line read: its custom_id, its job, and what its record keeps for the output line
    beyond the job (`encoding`: an embeddings line's vectors as base64)."""

    custom_id: str
    job: JobRequest
    fields: dict[str, str] = field(default_factory=dict)
    dimensions: int | None = None  # an embeddings line's, checked against the model


@dataclass
class Source:
    """How reading a batch's input file went: `gone` once it was found deleted (or
    expired) at the end (files.iter_whole); the lines read before are whole."""

    gone: bool = False


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def too_long(limit: int) -> LineError:
    return LineError("line_too_long", f"the line is longer than {limit} bytes, the limit of "
                     "one line (one request)")


def parse_line(endpoint: str, raw: bytes) -> Parsed:
    """A line's custom_id and its request as a native job (no I/O: runs on a thread for a
    long line); raises LineError, or ValidationError from the request's model."""
    try:
        line = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LineError("invalid_json", f"the line is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise LineError("invalid_json", "the line is nested too deeply") from exc
    if not isinstance(line, dict):
        raise LineError("invalid_request", "each line must be a JSON object")
    if (path := surrogates.where(line)) is not None:
        raise LineError("invalid_text", f"{path} holds a lone UTF-16 surrogate, which no "
                        "text can carry", path)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_required_parameter", "custom_id must be a non-empty string",
                        "custom_id")
    if "method" not in line:
        raise LineError("missing_required_parameter", "method is required (POST)", "method")
    if line["method"] != "POST":
        raise LineError("invalid_request", "method must be POST", "method")
    if line.get("url") != endpoint:
        raise LineError("mismatched_url", f"url must be the batch's endpoint "
                        f"{endpoint}, not {line.get('url')!r}", "url")
    body = line.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", "body")
    if endpoint == protocol.EmbeddingsEndpoint:
        emb = EmbeddingRequest.model_validate(body)
        job = JobRequest(model=emb.model, input=emb.texts(), priority="low")
        fields = {"encoding": "base64"} if emb.encoding_format == "base64" else {}
        return Parsed(custom_id, job, fields, emb.dimensions)
    req = protocol.parse(endpoint, body)
    if getattr(req, "stream", False):
        raise LineError("invalid_request", "stream is not allowed in a batch", "body.stream")
    if (req.n or 1) > 1 or req.log_k() is not None:
        raise LineError("invalid_request", "n > 1 and logprobs are served on the "
                        "interactive endpoints, not in batch lines", "body")
    job = req.to_job()
    job.priority = "low"  # live traffic first while a batch drains
    return Parsed(custom_id, job)


def custom_id_of(raw: bytes) -> str:
    try:
        custom_id = str(json.loads(raw).get("custom_id") or "")
    except Exception:
        return ""
    return "" if surrogates.where(custom_id) else custom_id
