"""The model catalogue (issue 41): one JSON record per served model name in the hash
tokenq:catalogue, versioned like the adapter registry (shared/lora_registry.py).

Every API replica, worker and autoscaler reads the same hash. The API seeds it at start
from its registry (the bundled defaults and TOKENQ_MODELS_FILE: origin `seed`, rewritten
by the next start) and admins deploy, patch and retire models over `/v1/models` (origin
`api`, never overwritten by a seed). Each change bumps tokenq:catalogue:version, so a
reader keeps its own copy and re-reads only when that number moved.

A deploy is a *load request*: `name`, `model_path`, `server_type`, `backend`, engine knobs
named as in llama-server and vLLM (the fields of ModelConfig), default generation
parameters, `keep_alive_s`. It maps onto ModelConfig here (`parse_load_request`); the
Redis side is shared/catalogue_io.py (sync) and api/models_admin.py (asyncio).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from tokenq.shared import keys
from tokenq.shared.lora_registry import NAME_PATTERN
from tokenq.shared.settings import ModelConfig

CATALOGUE = f"{keys.PREFIX}:catalogue"  # hash: name -> CatalogueEntry JSON
CATALOGUE_VERSION = f"{keys.PREFIX}:catalogue:version"  # INCR on every change
CATALOGUE_EVENTS = f"{keys.PREFIX}:catalogue:events"  # stream: one entry per change

# What an entry is doing; `ready` / `loading` / `idle` are not stored: they follow from
# the live workers' heartbeats and `loading_since` (see CatalogueEntry.state).
Phase = Literal["active", "failed", "draining", "retired"]
State = Literal["idle", "loading", "ready", "failed", "draining", "retired"]
QueuedOnRetire = Literal["finish", "fail"]

# Knobs of one engine only (names as in llama-server / vLLM): naming one on a model
# pinned to the other backend is refused, as it would be silently ignored.
LLAMA_KNOBS = frozenset({
    "n_ctx", "n_parallel", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "flash_attn",
    "kv_unified", "prefill_itl_ratio", "prefill_min_chunk", "prefill_whole_tokens",
    "prefill_burst_s",
    "prefix_cache", "prompt_cache_ram_mb", "first_token_flush_ms"})
VLLM_KNOBS = frozenset({
    "gpu_memory_utilization", "tensor_parallel_size", "max_model_len", "max_num_seqs",
    "quantization", "dtype", "enable_prefix_caching", "enforce_eager",
    "enable_chunked_prefill", "max_num_batched_tokens", "batch_alone_prefill_tokens",
    "disable_any_whitespace",
    "enable_lora", "max_loras",
    "max_lora_rank", "max_cpu_loras", "hf_path"})
COMMON_KNOBS = frozenset({
    "chat_template", "temperature", "top_p", "top_k", "min_p", "max_tokens", "repeat_penalty",
    "stop", "tool_call_parser", "source", "fake_tokens_per_s", "batch_prefill_tokens"})
# The load request's own fields (not ModelConfig's).
REQUEST_FIELDS = frozenset({"name", "model_path", "server_type", "backend", "keep_alive_s",
                            "max_load_tries", "check_path", "max_workers"})
BACKENDS = ("auto", "llama", "vllm", "fake")  # fake: the test engine (workers/engines/fake)
GGUF_MAGIC = b"GGUF"
DEFAULT_KEEP_ALIVE_S = 300.0
DEFAULT_MAX_LOAD_TRIES = 3


class SpecError(ValueError):
    """A load request that cannot be served: the message and the field it is about."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


class CatalogueEntry(BaseModel):
    name: str
    spec: ModelConfig
    request: dict[str, Any]  # the load request as given (PATCH merges onto it)
    origin: Literal["seed", "api"] = "api"
    version: int = 1
    phase: Phase = "active"
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S  # idle this long: scaled to zero; 0 = never
    max_load_tries: int = DEFAULT_MAX_LOAD_TRIES
    # Workers serving it at once across every pool, at most (None: as the pools scale);
    # 1: a single instance (each pool claims an instance lease before it starts one:
    # cli/autoscale_catalogue.py).
    max_workers: int | None = None
    queued_on_retire: QueuedOnRetire = "finish"
    loading_since: float | None = None  # a worker is building the engine (Unix time)
    load_failures: int = 0  # failed loads of this version, in a row
    error: str | None = None  # the last load's error
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)

    @property
    def served(self) -> bool:
        """New jobs may name it."""
        return self.phase == "active"

    def state(self, live_workers: int, now: float | None = None) -> State:
        if self.phase != "active":
            return self.phase
        if live_workers:
            return "ready"
        if self.loading_since is not None and (now or time.time()) - self.loading_since < 600:
            return "loading"
        return "idle"

    def touch(self) -> None:
        self.updated_at = time.time()


def check_weights(cfg: ModelConfig, backend: str) -> None:
    """The weights as the API sees them: a file that exists and is a GGUF (llama.cpp), or a
    Hugging Face folder with its config.json (vLLM). Blocking (reads 4 bytes): run it off
    the event loop."""
    if cfg.source not in ("file", "hf") or cfg.path is None:
        return
    path = Path(cfg.path).expanduser()
    if not path.exists():
        raise SpecError(f"model_path {cfg.path!r} does not exist here (if the weights are "
                        "only on the workers' filesystem, send \"check_path\": false)",
                        "model_path")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"model_path {cfg.path!r} is a folder without config.json: not a "
                            "Hugging Face model folder", "model_path")
        return
    if backend in ("llama", "auto", "fake"):
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise SpecError(f"model_path {cfg.path!r}: cannot read it ({exc})",
                            "model_path") from exc
        if magic != GGUF_MAGIC:
            raise SpecError(f"model_path {cfg.path!r} is not a GGUF file (it starts with "
                            f"{magic!r}, not b'GGUF')", "model_path")


def parse_load_request(body: dict[str, Any]) -> tuple[str, ModelConfig, dict[str, Any]]:
    """A load request -> (name, the ModelConfig it means, its own options: keep_alive_s,
    max_load_tries, check_path). Raises SpecError naming the field; checks no files
    (check_weights does)."""
    if not isinstance(body, dict):
        raise SpecError("a load request is a JSON object")
    unknown = sorted(set(body) - REQUEST_FIELDS - LLAMA_KNOBS - VLLM_KNOBS - COMMON_KNOBS)
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r} (engine knobs are named as in "
                        "llama-server and vLLM: n_ctx, n_parallel, max_model_len, ...)",
                        unknown[0])
    name = body.get("name")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise SpecError("name: 1-64 characters of letters, digits and ._:- (starting with a "
                        "letter or digit)", "name")
    backend = body.get("backend", "auto")
    if backend not in BACKENDS:
        raise SpecError(f"backend {backend!r} is unknown: one of auto, llama, vllm", "backend")
    server_type = body.get("server_type", "llm")
    if server_type not in ("llm", "embedding"):
        raise SpecError(f"server_type {server_type!r}: one of llm, embedding", "server_type")
    other = VLLM_KNOBS if backend == "llama" else LLAMA_KNOBS if backend == "vllm" else set()
    wrong = sorted(set(body) & other)
    if wrong:
        raise SpecError(f"{wrong[0]!r} is a {'vLLM' if backend == 'llama' else 'llama.cpp'} "
                        f"knob; this model's backend is {backend!r}", wrong[0])
    opts = {"keep_alive_s": body.get("keep_alive_s", DEFAULT_KEEP_ALIVE_S),
            "max_load_tries": body.get("max_load_tries", DEFAULT_MAX_LOAD_TRIES),
            "check_path": body.get("check_path", True),
            "max_workers": body.get("max_workers")}
    mw = opts["max_workers"]
    if mw is not None and (not isinstance(mw, int) or isinstance(mw, bool)
                           or not 1 <= mw <= 1000):
        raise SpecError("max_workers: an integer from 1 to 1000 (workers serving the model "
                        "at once, across every pool), or null", "max_workers")
    if not isinstance(opts["keep_alive_s"], int | float) or isinstance(
            opts["keep_alive_s"], bool) or not 0 <= opts["keep_alive_s"] < math.inf:
        raise SpecError("keep_alive_s: seconds >= 0 (0 = never unload)", "keep_alive_s")
    if not isinstance(opts["max_load_tries"], int) or not 1 <= opts["max_load_tries"] <= 20:
        raise SpecError("max_load_tries: an integer from 1 to 20", "max_load_tries")
    if not isinstance(opts["check_path"], bool):
        raise SpecError("check_path: true or false", "check_path")
    fields = {k: v for k, v in body.items() if k not in REQUEST_FIELDS}
    path = body.get("model_path")
    source = fields.get("source", "file")
    if path is None and source in ("file", "hf") and backend != "fake":
        raise SpecError("model_path is required: a GGUF file (llama.cpp) or a Hugging Face "
                        "folder (vLLM)", "model_path")
    if path is not None:
        if not isinstance(path, str) or not path or len(path) > 4096:
            raise SpecError("model_path: a path on the workers' filesystem", "model_path")
        fields["path"] = path
        if "source" not in fields and opts["check_path"] and Path(path).expanduser().is_dir():
            fields["source"] = "hf"
    try:
        cfg = ModelConfig.model_validate({**fields, "backend": backend,
                                          "embedding": server_type == "embedding"})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        msg = err["msg"].removeprefix("Value error, ")
        raise SpecError(f"{where + ': ' if where else ''}{msg}", where) from exc
    return name, cfg, opts


def request_of(cfg: ModelConfig) -> dict[str, Any]:
    """A seeded model's registry entry written as a load request (for GET and PATCH)."""
    out = cfg.model_dump(exclude_defaults=True, exclude={"path", "embedding"})
    if cfg.path is not None:
        out["model_path"] = cfg.path
    out["server_type"] = "embedding" if cfg.embedding else "llm"
    out["backend"] = cfg.backend
    return out


def seed_entry(name: str, cfg: ModelConfig) -> CatalogueEntry:
    return CatalogueEntry(name=name, spec=cfg, request=request_of(cfg), origin="seed",
                          keep_alive_s=0.0)


def public(entry: CatalogueEntry, workers: list[str], admin: bool) -> dict[str, Any]:
    """GET /v1/models/{name} for an admin key: spec, paths, state, version, workers."""
    out: dict[str, Any] = {
        "id": entry.name, "object": "model", "owned_by": "tokenq", "origin": entry.origin,
        "state": entry.state(len(workers)), "version": entry.version,
        "workers": workers, "keep_alive_s": entry.keep_alive_s,
        "server_type": "embedding" if entry.spec.embedding else "llm",
        "backend": entry.spec.backend, "error": entry.error,
        "load_failures": entry.load_failures, "max_load_tries": entry.max_load_tries,
        "max_workers": entry.max_workers, "updated_at": entry.updated_at}
    if admin:
        out["spec"] = entry.spec.model_dump()
        out["request"] = entry.request
    return out
