"""GET /v1/jobs (filters, cursor pages, expired records dropped) and Idempotency-Key on
POST /v1/jobs and POST /v1/batches."""

from __future__ import annotations

import uuid

import httpx
import redis

from tests.conftest import NO_WORKER_MODEL, SMOL
from tokenq.shared import keys


def idle_jobs(client: httpx.Client, n: int, tag: str) -> list[str]:
    ids = []
    for i in range(n):
        resp = client.post("/v1/jobs", json={"model": NO_WORKER_MODEL, "prompt": f"p{i}",
                                             "max_tokens": 4, "metadata": {"run": tag}})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    return ids


def test_list_pages_newest_first_with_filters(client: httpx.Client) -> None:
    tag = uuid.uuid4().hex
    ids = idle_jobs(client, 5, tag)
    try:
        seen, after, pages = [], None, 0
        while True:
            params = {"limit": "2", "metadata[run]": tag, "status": "queued"}
            if after:
                params["after"] = after
            page = client.get("/v1/jobs", params=params).json()
            assert page["object"] == "list"
            seen += [j["id"] for j in page["data"]]
            assert all(j["metadata"] == {"run": tag} and j["status"] == "queued"
                       for j in page["data"])
            pages += 1
            if not page["has_more"]:
                break
            after = page["last_id"]
            assert after == page["data"][-1]["id"]
        assert seen == ids[::-1] and pages == 3
        # model filter; a filter nothing matches
        assert len(client.get("/v1/jobs", params={"model": NO_WORKER_MODEL, "metadata[run]": tag}
                              ).json()["data"]) == 5
        assert client.get("/v1/jobs", params={"model": SMOL, "metadata[run]": tag}
                          ).json()["data"] == []
        client.delete(f"/v1/jobs/{ids[0]}")
        got = client.get("/v1/jobs", params={"state": "cancelled", "metadata[run]": tag}).json()
        assert [j["id"] for j in got["data"]] == [ids[0]]
    finally:
        for job_id in ids:
            client.delete(f"/v1/jobs/{job_id}")


def test_list_refuses_bad_filters_with_400(client: httpx.Client) -> None:
    for params in ({"state": "done"}, {"status": "done"}, {"limit": "0"}, {"limit": "101"},
                   {"after": "job_nope"}):
        resp = client.get("/v1/jobs", params=params)
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json()["error"]["type"] == "invalid_request_error"


def test_list_drops_expired_records(client: httpx.Client, stack_redis: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    ids = idle_jobs(client, 2, tag)
    client.delete(f"/v1/jobs/{ids[0]}")
    stack_redis.delete(keys.job(ids[0]))  # as if result_ttl_s had passed
    got = client.get("/v1/jobs", params={"metadata[run]": tag}).json()
    assert [j["id"] for j in got["data"]] == [ids[1]]
    assert stack_redis.zscore(keys.tenant_jobs("default"), ids[0]) is None
    client.delete(f"/v1/jobs/{ids[1]}")


def test_idempotency_key_on_jobs(client: httpx.Client) -> None:
    key = "retry-" + uuid.uuid4().hex
    body = {"model": NO_WORKER_MODEL, "prompt": "once", "max_tokens": 4}
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    again = client.post("/v1/jobs", json=dict(reversed(body.items())),
                        headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    other = client.post("/v1/jobs", json={**body, "prompt": "twice"},
                        headers={"Idempotency-Key": key})
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    # one job in the tenant's index for the key, and a new key makes a new job
    fresh = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key + "x"})
    assert fresh.json()["id"] != first.json()["id"]
    for resp in (first, fresh):
        client.delete(f"/v1/jobs/{resp.json()['id']}")
    # the cancelled job still answers a retry with its current status
    replay = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert replay.json()["id"] == first.json()["id"]
    assert replay.json()["status"] == "cancelled"
    too_long = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k" * 256})
    assert too_long.status_code == 400


def test_idempotency_key_on_batches(client: httpx.Client) -> None:
    line = ('{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":'
            f'{{"model":"{NO_WORKER_MODEL}","messages":[{{"role":"user","content":"x"}}],'
            '"max_tokens":2}}\n')
    f = client.post("/v1/files", data={"purpose": "batch"},
                    files={"file": ("in.jsonl", line.encode())}).json()
    key = "batch-" + uuid.uuid4().hex
    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}
    first = client.post("/v1/batches", json=body, headers={"Idempotency-Key": key})
    again = client.post("/v1/batches", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/batches", json={**body, "metadata": {"a": "b"}},
                        headers={"Idempotency-Key": key})
    assert other.status_code == 422
    client.post(f"/v1/batches/{first.json()['id']}/cancel")
