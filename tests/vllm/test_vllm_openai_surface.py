"""The OpenAI surface on the vLLM worker: the same checks as on llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from tests import surface_checks as checks
from tests.vllm.conftest import MAX_MODEL_LEN, TINY
from tokenq.cli.stack import Stack

pytestmark = pytest.mark.vllm


@pytest.fixture
def voai(vllm_stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vllm_stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def test_tokenize_detokenize_and_context(vclient: httpx.Client, voai: openai.OpenAI) -> None:
    checks.check_tokenize_roundtrip(vclient, voai, TINY)
    assert voai.models.retrieve(TINY).max_model_len == MAX_MODEL_LEN  # type: ignore[attr-defined]
    checks.check_tokenize_bad_input(vclient, TINY)


def test_logit_bias(vclient: httpx.Client, voai: openai.OpenAI) -> None:
    checks.check_logit_bias(vclient, voai, TINY)


def test_min_p_and_penalties(voai: openai.OpenAI) -> None:
    # The tiny random model's bf16 logits tie exactly at some steps; that min_p reaches
    # vLLM is checked on its SamplingParams (test_min_p_reaches_vllm).
    checks.check_min_p_and_penalties(voai, TINY, min_p_is_greedy=False)


def test_min_p_reaches_vllm() -> None:
    from tokenq.shared.schemas import SamplingParams
    from tokenq.workers.engines.vllm_args import sampling_params

    p = SamplingParams(max_tokens=4, temperature=1.5, top_p=1.0, top_k=0,
                       repetition_penalty=1.0, min_p=1.0, presence_penalty=0.5,
                       frequency_penalty=0.25)
    got = sampling_params(p, max_tokens=4)
    assert (got.min_p, got.presence_penalty, got.frequency_penalty) == (1.0, 0.5, 0.25)


def test_sampling_bad_input_enqueues_nothing(voai: openai.OpenAI, vllm_stack: Stack) -> None:
    r = redis.Redis.from_url(vllm_stack.redis_url, decode_responses=True)
    before = checks.job_records(r)
    checks.check_sampling_bad_input(voai, TINY)
    assert checks.job_records(r) == before
    r.close()


def test_logprobs_chat_and_completions(voai: openai.OpenAI) -> None:
    checks.check_logprobs(voai, TINY)


def test_n_choices(voai: openai.OpenAI) -> None:
    checks.check_n(voai, TINY)


def test_logprobs_and_n_bad_input(voai: openai.OpenAI) -> None:
    checks.check_logprobs_n_bad_input(voai, TINY)
