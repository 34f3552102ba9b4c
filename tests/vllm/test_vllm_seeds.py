"""A seeded request's dropped draw on a CPU engine (workers/engines/vllm_seeds.py): the
step runs, and the request's generator is left as if the step had not drawn for it.
The engine end to end: tests/vllm/test_vllm_worker.py (seeded prompts split over steps)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tokenq.workers.engines.vllm_seeds import install, keep_dropped_draws

pytestmark = pytest.mark.vllm
torch = pytest.importorskip("torch")


def seeded(seed: int) -> Any:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def vllm_step(runner: Any) -> str:
    """What vLLM's sample_tokens does with the generators: a draw for every seeded request,
    then the CUDA rewind for each request whose token is dropped."""
    for gen in runner.input_batch.generators.values():
        torch.rand(8, generator=gen)
    for i in np.nonzero(runner.discard_request_mask.np[:runner.input_batch.num_reqs])[0]:
        gen = runner.input_batch.generators.get(int(i))
        if gen is not None:
            gen.set_offset(gen.get_offset() - 4)
    return "step output"


def runner(generators: dict[int, Any], dropped: list[bool]) -> Any:
    return SimpleNamespace(input_batch=SimpleNamespace(generators=generators,
                                                       num_reqs=len(dropped)),
                           discard_request_mask=SimpleNamespace(np=np.array(dropped)))


def test_vllms_rewind_raises_on_a_cpu_generator() -> None:
    with pytest.raises(RuntimeError, match="offset"):
        vllm_step(runner({0: seeded(7)}, [True]))


def test_a_dropped_draw_leaves_the_generator_as_it_was() -> None:
    split, whole = seeded(7), seeded(8)
    r = runner({0: split, 1: whole}, [True, False])
    assert keep_dropped_draws(vllm_step)(r) == "step output"
    assert r.input_batch.generators == {0: split, 1: whole}
    assert torch.equal(torch.rand(8, generator=split), torch.rand(8, generator=seeded(7)))
    advanced = seeded(8)
    torch.rand(8, generator=advanced)
    assert torch.equal(torch.rand(8, generator=whole), torch.rand(8, generator=advanced))


def test_generators_are_put_back_when_the_step_fails() -> None:
    gen = seeded(7)
    r = runner({2: gen}, [False, False, True])

    def failing(_: Any) -> None:
        torch.rand(8, generator=gen)
        raise ValueError("step failed")

    with pytest.raises(ValueError, match="step failed"):
        keep_dropped_draws(failing)(r)
    assert r.input_batch.generators == {2: gen}
    assert torch.equal(torch.rand(8, generator=gen), torch.rand(8, generator=seeded(7)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vLLM's imports, not ours
def test_install_wraps_the_model_runner_once() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    before: Any = GPUModelRunner.sample_tokens
    try:
        install()
        install()
        wrapped: Any = GPUModelRunner.sample_tokens
        assert wrapped.tokenq_keeps_dropped_draws
        assert wrapped.__wrapped__ is before
    finally:
        setattr(GPUModelRunner, "sample_tokens", before)  # noqa: B010
