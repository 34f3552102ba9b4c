"""The dtype tokenq's vLLM worker (and the bench's `vllm serve` peer) runs: "auto" is
float32 on an x86 CPU that only emulates bf16 (workers/engines/vllm_args.engine_dtype)."""

from __future__ import annotations

import pytest

from tokenq.workers.engines import vllm_args
from tokenq.workers.engines.vllm_args import engine_dtype

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx fma f16c avx2 bmi2\n"
AVX512_BF16 = "flags\t\t: fpu avx2 avx512f avx512bw avx512_bf16\n"
AMX = "flags\t\t: fpu avx2 avx512f amx_tile amx_bf16 amx_int8\n"
ARM = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n"


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_args, "has_nvidia_gpu", lambda: False)


def test_auto_is_float32_where_bf16_is_emulated() -> None:
    assert engine_dtype("auto", AVX2) == "float32"


@pytest.mark.parametrize("cpuinfo", [AVX512_BF16, AMX, ARM, ""])
def test_auto_stays_auto_where_bf16_is_native_or_unknown(cpuinfo: str) -> None:
    assert engine_dtype("auto", cpuinfo) == "auto"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_an_explicit_dtype_is_kept(dtype: str) -> None:
    assert engine_dtype(dtype, AVX2) == dtype


def test_a_gpu_host_keeps_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_args, "has_nvidia_gpu", lambda: True)
    assert engine_dtype("auto", AVX2) == "auto"
