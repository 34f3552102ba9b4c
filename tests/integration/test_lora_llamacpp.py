"""LoRA on the llama.cpp engine (SmolLM2 + tiny random GGUF adapters written here).

Adapters apply per context, so the engine runs one adapter group per step: these tests
check that each job still gets exactly its own adapter's greedy text, mixed or alone,
that releasing an adapter restores the base text, and that the prefix cache never
hands one adapter's KV to another.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_llamacpp_engine import Collector, request, start_engine
from tests.lora_fixtures import write_gguf_lora
from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.llamacpp import LlamaCppEngine

PROMPT = "Name three colours."


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("lora")
    settings = Settings(state_dir=tmp)
    base = gguf_path(settings.models()["smollm2-135m-instruct"], tmp)
    return {n: write_gguf_lora(base, tmp / f"{n}.gguf", seed=seed)
            for n, seed in (("a", 1), ("b", 2))}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaCppEngine, Collector]]:
    # prefix_cache off: reused KV meets other batch shapes (see test_llamacpp_engine.py)
    # One thread: this shared machine's cores are oversubscribed, and llama.cpp's threads
    # spin at every barrier when they are (steps were ~2 s with 2 threads at load 8).
    eng, col = start_engine(tmp_path_factory.mktemp("lora-engine"), prefix_cache=False,
                            n_threads=1)
    yield eng, col
    eng.close()


def run(eng: LlamaCppEngine, col: Collector, job_id: str, ref: AdapterRef | None,
        prompt: str = PROMPT, max_tokens: int = 12) -> str:
    req = request(job_id, prompt, max_tokens)
    req.adapter = ref
    eng.submit(req)
    col.wait([job_id], timeout=600)
    assert col.finished[job_id].reason in ("stop", "length"), col.finished[job_id]
    return col.output(job_id)


def test_adapter_changes_output_and_release_restores_base(
        engine: tuple[LlamaCppEngine, Collector], adapters: dict[str, Path]) -> None:
    eng, col = engine
    a = AdapterRef(name="a", id=101, path=str(adapters["a"]))
    base = run(eng, col, "base-1", None)
    t0 = time.perf_counter()
    eng.load_adapter(a)
    load_s = time.perf_counter() - t0
    with_a = run(eng, col, "a-1", a)
    assert with_a != base
    assert run(eng, col, "a-2", a) == with_a  # deterministic per adapter
    eng.unload_adapter(a)
    assert run(eng, col, "base-2", None) == base  # exactly the base text again
    deadline = time.monotonic() + 5
    while 101 in eng.lora.loaded() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng.lora.loaded() == []  # freed: no job uses it and the registry dropped it
    # A job submitted before the unload (version pinned in its spec) still runs on it:
    assert run(eng, col, "a-3", a) == with_a
    assert eng.lora.loaded() == []  # and it is freed again when that job ends
    print(f"llama.cpp LoRA load (engine): {load_s * 1000:.1f} ms")


def test_mixed_adapters_in_flight_match_each_alone(
        engine: tuple[LlamaCppEngine, Collector], adapters: dict[str, Path]) -> None:
    eng, col = engine
    refs = [None, AdapterRef(name="a", id=201, path=str(adapters["a"])),
            AdapterRef(name="b", id=202, path=str(adapters["b"]))]
    for ref in refs[1:]:
        assert ref is not None
        eng.load_adapter(ref)
    # 8 jobs over 3 groups x 2 prompts: 6 distinct (adapter, prompt), each run alone once
    jobs = [(f"mix-{i}", refs[i % 3], f"Write one sentence about the number {i % 2}.")
            for i in range(8)]
    alone: dict[tuple[int, str], str] = {}
    for _, ref, p in jobs:
        key = (ref.id if ref else 0, p)
        if key not in alone:
            alone[key] = run(eng, col, f"alone-{len(alone)}", ref, p, 8)
    assert len({alone[(r.id if r else 0, jobs[0][2])] for r in refs}) == 3  # they differ
    for jid, ref, p in jobs:
        req = request(jid, p, 8)
        req.adapter = ref
        eng.submit(req)
    col.wait([j for j, _, _ in jobs], timeout=900)
    for jid, ref, p in jobs:
        assert col.finished[jid].reason in ("stop", "length")
        assert col.output(jid) == alone[(ref.id if ref else 0, p)], jid


def test_prefix_cache_never_shared_across_adapters(
        tmp_path: Path, adapters: dict[str, Path]) -> None:
    eng, col = start_engine(tmp_path, prefix_cache=True, n_parallel=1, n_threads=1)
    try:
        a = AdapterRef(name="a", id=301, path=str(adapters["a"]))
        prompt = "Summarise: the customer called about a duplicate charge on the invoice."
        run(eng, col, "p-base", None, prompt, 4)
        before = eng.prefix_reused_tokens
        with_a = run(eng, col, "p-a", a, prompt, 8)
        assert eng.prefix_reused_tokens == before  # base KV is not reused for adapter a
        assert run(eng, col, "p-a2", a, prompt, 8) == with_a
        assert eng.prefix_reused_tokens > before  # a's own KV is
    finally:
        eng.close()


def test_job_whose_adapter_cannot_load_fails_alone(
        engine: tuple[LlamaCppEngine, Collector], tmp_path: Path) -> None:
    eng, col = engine
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    req = request("bad-adapter", PROMPT, 4)
    req.adapter = AdapterRef(name="junk", id=401, path=str(junk))
    eng.submit(req)
    col.wait(["bad-adapter"], timeout=600)
    f = col.finished["bad-adapter"]
    assert (f.reason, f.error_code) == ("error", "adapter_load_failed")
    with pytest.raises(RuntimeError):
        eng.load_adapter(req.adapter)  # the watcher's path reports it too
    assert eng.healthy() and 401 not in eng.lora.loaded()
    assert run(eng, col, "after-bad", None, PROMPT, 2)  # and the engine serves on
