"""The client's API key (argument or TOKENQ_API_KEY), and tenants apart in GET /v1/jobs
and in Idempotency-Keys."""

from __future__ import annotations

import pytest

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE, FAKE_IDLE
from tokenq.cli.stack import Stack
from tokenq.client import APIError, Client, TokenEvent


def test_key_from_env_and_tenants_apart(secure_stack: Stack,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_API_KEY", KEYS["alpha"])
    with Client(secure_stack.url) as alpha, Client(secure_stack.url,
                                                   api_key=KEYS["beta"]) as beta:
        job = alpha.submit(FAKE, "go", max_tokens=12)
        toks = [e for e in alpha.stream(job.id) if isinstance(e, TokenEvent)]
        assert [t.index for t in toks] == list(range(12))
        assert job.id in {j.id for j in alpha.iter_jobs(model=FAKE)}
        assert job.id not in {j.id for j in beta.iter_jobs()}
        with pytest.raises(APIError) as err:
            beta.get(job.id)
        assert err.value.status == 404
        # One Idempotency-Key, two tenants: two jobs.
        a = alpha.submit(FAKE_IDLE, "x", max_tokens=2, idempotency_key="shared-key")
        b = beta.submit(FAKE_IDLE, "x", max_tokens=2, idempotency_key="shared-key")
        assert a.id != b.id
        assert alpha.submit(FAKE_IDLE, "x", max_tokens=2, idempotency_key="shared-key").id == a.id
        alpha.cancel(a.id)
        beta.cancel(b.id)
    monkeypatch.delenv("TOKENQ_API_KEY")
    with Client(secure_stack.url) as nobody, pytest.raises(APIError) as err:
        nobody.list()
    assert err.value.status == 401 and err.value.code == "invalid_api_key"
