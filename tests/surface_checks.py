"""OpenAI-surface checks run against both engines (llama.cpp and vLLM stacks).

Each takes the official SDK client, a plain HTTP client on the same stack and the
model name, so tests/integration and tests/vllm assert the same behaviour.
"""

from __future__ import annotations

import httpx
import openai


def tokenize(http: httpx.Client, model: str, text: str, *, special: bool = False) -> list[int]:
    resp = http.post("/tokenize", json={"model": model, "prompt": text,
                                        "add_special_tokens": special})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) and body["token_strs"] is None
    return [int(t) for t in body["tokens"]]


def check_tokenize_roundtrip(http: httpx.Client, oai: openai.OpenAI, model: str) -> None:
    text = "The customer was charged twice."
    ids = tokenize(http, model, text)
    assert ids
    back = http.post("/detokenize", json={"model": model, "tokens": ids})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    # The prompt a job sees is what /tokenize counts (with special tokens, as jobs have).
    counted = http.post("/tokenize", json={"model": model, "prompt": text}).json()
    out = oai.completions.create(model=model, prompt=text, max_tokens=1, temperature=0)
    assert out.usage is not None and out.usage.prompt_tokens == counted["count"]
    # /v1/models and /tokenize agree on what one request may use.
    listed = {m.id: m for m in oai.models.list()}
    assert listed[model].max_model_len == counted["max_model_len"]  # type: ignore[attr-defined]
    chat = http.post("/tokenize", json={"model": model,
                                        "messages": [{"role": "user", "content": text}]})
    assert chat.status_code == 200 and chat.json()["count"] > len(ids)


def check_tokenize_bad_input(http: httpx.Client, model: str) -> None:
    for path, body, status in [
        ("/tokenize", {"model": "no-such-model", "prompt": "x"}, 404),
        ("/tokenize", {"model": model}, 400),
        ("/detokenize", {"model": model, "tokens": [10**9]}, 400),
        ("/detokenize", {"model": model, "tokens": [-1]}, 400),
        ("/detokenize", {"model": model, "tokens": "abc"}, 400),
    ]:
        resp = http.post(path, json=body)
        assert resp.status_code == status, (path, body, resp.text)
        assert set(resp.json()["error"]) == {"message", "type", "code", "param"}


def check_logit_bias(http: httpx.Client, oai: openai.OpenAI, model: str) -> None:
    """+100 on one token makes greedy decoding emit only that token; -100 on the greedy
    first token makes the first token another."""
    (tok,) = tokenize(http, model, " blue")[-1:]
    prompt = "My favourite colour is"
    out = oai.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0,
                                 logit_bias={str(tok): 100})
    want = http.post("/detokenize", json={"model": model, "tokens": [tok] * 3}).json()
    assert out.choices[0].text == want["prompt"]
    plain = oai.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
    (first,) = tokenize(http, model, prompt + plain.choices[0].text)[-1:]
    banned = oai.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                    logit_bias={str(first): -100})
    assert banned.choices[0].text != plain.choices[0].text


def check_min_p_and_penalties(oai: openai.OpenAI, model: str) -> None:
    prompt = "one two one two one two one two one two"
    greedy = oai.completions.create(model=model, prompt=prompt, max_tokens=12,
                                    temperature=0).choices[0].text
    # min_p = 1 keeps only the most likely token: hot sampling becomes greedy.
    for seed in (1, 2, 3):
        hot = oai.completions.create(model=model, prompt=prompt, max_tokens=12,
                                     temperature=1.5, seed=seed, extra_body={"min_p": 1.0})
        assert hot.choices[0].text == greedy
    # Seeded hot sampling repeats itself exactly; a frequency or presence penalty changes
    # the distribution after the first repeated token, so the draw changes.
    def hot(**kw: float) -> str:
        return oai.completions.create(model=model, prompt=prompt, max_tokens=16,
                                      temperature=2.0, seed=7,
                                      **kw).choices[0].text  # type: ignore[arg-type]

    base = hot()
    assert hot() == base
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        assert hot(**kw) != base, kw


def check_sampling_bad_input(oai: openai.OpenAI, model: str) -> None:
    for kw in ({"logit_bias": {"abc": 1}}, {"logit_bias": {"5": 101}},
               {"logit_bias": {str(10**8): 1}}, {"presence_penalty": 3},
               {"frequency_penalty": -2.5}, {"extra_body": {"min_p": 1.5}}):
        try:
            oai.completions.create(model=model, prompt="x", max_tokens=2,
                                   **kw)  # type: ignore[arg-type]
        except openai.BadRequestError as exc:
            assert isinstance(exc.body, dict) and "message" in exc.body
        else:
            raise AssertionError(f"{kw} was accepted")
