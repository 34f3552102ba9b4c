"""OpenAI-surface checks run against both engines (llama.cpp and vLLM stacks).

Each takes the official SDK client, a plain HTTP client on the same stack and the
model name, so tests/integration and tests/vllm assert the same behaviour.
"""

from __future__ import annotations

import httpx
import openai
import redis

from tokenq.shared import keys


def sdk(base_url: str) -> openai.OpenAI:
    """The official client on a stack's URL, without retries (a test sees every error)."""
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def job_records(r: redis.Redis) -> int:
    """Job records in a stack's Redis (`tokenq:job:<id>`, not a job's other keys): a request
    that enqueued a job left one, even after a worker took its message (a queue's length
    cannot tell: a live worker drains it within milliseconds)."""
    return sum(1 for k in r.scan_iter(keys.job("*")) if k.count(":") == 2)


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


def check_min_p_and_penalties(oai: openai.OpenAI, model: str, *,
                              min_p_is_greedy: bool = True) -> None:
    """min_p = 1 keeps only the most likely token: every token hot sampling picks has the
    highest raw log-probability at its position (a tie keeps each tied token). With
    `min_p_is_greedy` the text is also greedy decoding's; False where the top logits tie
    exactly (a random bf16 model), so greedy decoding may pick another tied token."""
    prompt = "one two one two one two one two one two"
    greedy = oai.completions.create(model=model, prompt=prompt, max_tokens=12,
                                    temperature=0).choices[0].text
    for seed in (1, 2, 3):
        hot = oai.completions.create(model=model, prompt=prompt, max_tokens=12,
                                     temperature=1.5, seed=seed, extra_body={"min_p": 1.0})
        assert hot.choices[0].text == greedy or not min_p_is_greedy
        chat = oai.chat.completions.create(  # type: ignore[call-overload]
            model=model, messages=CHAT, max_tokens=12, temperature=1.5, seed=seed,
            logprobs=True, top_logprobs=1, extra_body={"min_p": 1.0})
        picked = chat.choices[0].logprobs.content
        assert picked
        off_top = [(e.token, e.logprob, e.top_logprobs[0].logprob) for e in picked
                   if e.logprob < e.top_logprobs[0].logprob - 1e-5]
        assert off_top == [], f"min_p=1 sampled tokens below the top one (seed {seed})"
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


CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _check_entry(e: object, k: int) -> None:
    token, lp, raw, top = (getattr(e, a) for a in ("token", "logprob", "bytes", "top_logprobs"))
    assert isinstance(token, str) and isinstance(lp, float) and lp <= 0.0
    assert isinstance(raw, list) and len(top) == k
    lps = [t.logprob for t in top]
    assert lps == sorted(lps, reverse=True) and all(x <= 0.0 for x in lps)
    # Greedy decoding of the raw distribution: the sampled token is the most likely one.
    if k:
        assert abs(top[0].logprob - lp) < 1e-3


def check_logprobs(oai: openai.OpenAI, model: str) -> None:
    kw: dict[str, object] = {"model": model, "messages": CHAT, "max_tokens": 6,
                             "temperature": 0}
    out = oai.chat.completions.create(logprobs=True, top_logprobs=3, **kw)  # type: ignore[call-overload]
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert out.usage is not None and len(content) == out.usage.completion_tokens
    for e in content:
        _check_entry(e, 3)
    assert b"".join(bytes(e.bytes or []) for e in content).decode() == choice.message.content
    streamed = [e for c in oai.chat.completions.create(  # type: ignore[call-overload]
        logprobs=True, top_logprobs=3, stream=True, **kw)
        if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in content]
    plain = oai.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert plain.choices[0].logprobs is None
    # completions: parallel lists, one top-k dict per token
    comp = oai.completions.create(model=model, prompt="The capital of France is",
                                  max_tokens=5, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert all(1 <= len(d) <= 2 for d in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == comp.choices[0].text
    chunks = list(oai.completions.create(model=model, prompt="The capital of France is",
                                         max_tokens=5, temperature=0, logprobs=2,
                                         stream=True))
    toks = [t for c in chunks if c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens or []]
    assert toks == lp.tokens


def check_n(oai: openai.OpenAI, model: str) -> None:
    hot = oai.completions.create(model=model, prompt="My favourite animal is", n=3,
                                 max_tokens=8, temperature=1.5, seed=5)
    assert [c.index for c in hot.choices] == [0, 1, 2]
    assert len({c.text for c in hot.choices}) > 1  # seed + i per choice
    greedy = oai.chat.completions.create(model=model, messages=CHAT, n=2,  # type: ignore[arg-type]
                                         max_tokens=6, temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    one = oai.chat.completions.create(model=model, messages=CHAT, max_tokens=6,  # type: ignore[arg-type]
                                      temperature=0)
    assert greedy.usage is not None and one.usage is not None
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens
    assert greedy.usage.completion_tokens == 2 * one.usage.completion_tokens
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    usage = None
    for c in oai.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=6,  # type: ignore[arg-type]
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}):
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts == {0: one.choices[0].message.content, 1: one.choices[0].message.content}
    assert set(finishes) == {0, 1}
    assert usage is not None and usage.completion_tokens == greedy.usage.completion_tokens


def check_logprobs_n_bad_input(oai: openai.OpenAI, model: str) -> None:
    for kw in ({"n": 9}, {"n": 0}, {"logprobs": True, "top_logprobs": 21},
               {"top_logprobs": 2}, {"logprobs": True, "top_logprobs": -1}):
        try:
            oai.chat.completions.create(model=model, messages=CHAT, max_tokens=2,  # type: ignore[call-overload]
                                        **kw)
        except openai.BadRequestError as exc:
            assert isinstance(exc.body, dict) and "message" in exc.body
        else:
            raise AssertionError(f"{kw} was accepted")
    try:
        oai.completions.create(model=model, prompt="x", max_tokens=2, logprobs=21)
    except openai.BadRequestError:
        pass
    else:
        raise AssertionError("completions logprobs=21 was accepted")
