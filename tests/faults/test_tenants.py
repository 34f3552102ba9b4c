"""Keys and tenants: every route but health/ready/docs needs a key, and one
tenant's jobs, streams, files and batches are 404 to every other (1,000 probes)."""

from __future__ import annotations

import itertools
import json
import re
import uuid

import httpx
import redis

from tests.faults.conftest import auth
from tests.faults.harness import FAKE, FAKE_IDLE, submit, wait_terminal
from tokenq.cli.stack import Stack
from tokenq.shared import keys

PUBLIC = {"/health", "/ready"}  # /metrics too needs a key (a `metrics` one)


def routes(stack: Stack) -> list[tuple[str, str]]:
    """(method, path) of every route in the app's OpenAPI spec: new routes are covered
    as soon as they exist (files and batches included)."""
    spec = httpx.get(f"{stack.url}/openapi.json", timeout=10).json()  # public: no key
    return [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops]


def fill(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, path)


def test_every_route_needs_a_key(secure_stack: Stack) -> None:
    found = routes(secure_stack)
    assert {("POST", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}/events"),
            ("GET", "/v1/admin/workers")} <= set(found)
    checked = 0
    with httpx.Client(base_url=secure_stack.url, timeout=10) as c:
        for (method, path), headers in itertools.product(
                found, [{}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic a2V5LWFscGhhOg=="}, auth("alpha") | {
                            "Authorization": "bearer"}]):
            if path in PUBLIC:
                continue
            resp = c.request(method, fill(path, "x" + uuid.uuid4().hex), headers=headers,
                             json={} if method == "POST" else None)
            assert resp.status_code == 401, (method, path, headers, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key"
            checked += 1
        for path in PUBLIC:
            assert c.get(path).status_code in (200, 503), path  # /ready: 503 is still open
    print(f"\n[faults] {checked} requests without a valid key on {len(found) - len(PUBLIC)} "
          "routes: all 401")


def test_admin_routes_need_an_admin_key(secure_stack: Stack) -> None:
    with httpx.Client(base_url=secure_stack.url, timeout=10) as c:
        assert c.get("/v1/admin/workers").status_code == 401
        resp = c.get("/v1/admin/workers", headers=auth("alpha"))
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "permission_denied"
        resp = c.get("/v1/admin/workers", headers=auth("admin"))
        assert resp.status_code == 200 and resp.json()["data"][0]["model"] == FAKE


def alpha_objects(c: httpx.Client, r: redis.Redis) -> dict[str, list[str]]:
    """Jobs (finished and queued), and a file and a batch where those routes exist."""
    done = submit(c, 3, 3)
    queued = submit(c, 2, 3, model=FAKE_IDLE)
    wait_terminal(r, done, timeout=30)
    ids: dict[str, list[str]] = {"job": done + queued, "file": [], "batch": []}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": FAKE_IDLE, "max_tokens": 2,
                     "messages": [{"role": "user", "content": "hi"}]}}
    resp = c.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line) + "\n")},
                  data={"purpose": "batch"})
    if resp.status_code != 404:  # the Files API is there
        assert resp.status_code == 200, resp.text
        ids["file"].append(resp.json()["id"])
        resp = c.post("/v1/batches", json={"input_file_id": ids["file"][0],
                                           "endpoint": "/v1/chat/completions",
                                           "completion_window": "24h"})
        assert resp.status_code == 200, resp.text
        ids["batch"].append(resp.json()["id"])
    return ids


def test_1000_cross_tenant_probes_are_all_404(secure_stack: Stack, alpha: httpx.Client,
                                              secure_redis: redis.Redis) -> None:
    ids = alpha_objects(alpha, secure_redis)
    everything = [i for v in ids.values() for i in v]
    # Admin routes hold no tenant's objects and answer 403 to any tenant key
    # (test_adapters_admin.py; the catalogue's PATCH and DELETE, test_models_api.py);
    # every other id route must be 404 to another tenant.
    targets = [(m, p) for m, p in routes(secure_stack)
               if "{" in p and p.startswith("/v1/") and not p.startswith("/v1/adapters")
               and not (p.startswith("/v1/models/") and m in ("PATCH", "DELETE"))]
    statuses: dict[int, int] = {}
    probes = 0
    with httpx.Client(base_url=secure_stack.url, timeout=10, headers=auth("beta")) as beta:
        while probes < 1000:
            for method, path in targets:
                param = re.findall(r"\{([^}]+)\}", path)[0]
                kind = next((k for k in ids if k in param), "")
                for obj in ids.get(kind) or everything:
                    resp = beta.request(method, fill(path, obj))
                    statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                    assert resp.status_code == 404, (method, path, obj, resp.text)
                    assert resp.json()["error"]["type"] == "invalid_request_error"
                    probes += 1
        # Listings show beta none of alpha's objects.
        for method, path in routes(secure_stack):
            if method == "GET" and "{" not in path and path.startswith("/v1/") \
                    and "admin" not in path:
                text = beta.get(path).text
                assert not any(i in text for i in everything), path
    # Nothing beta did (DELETE, cancel) touched alpha's objects.
    for job_id in ids["job"][3:]:
        assert secure_redis.hget(keys.job(job_id), "state") == "queued"
    for batch_id in ids["batch"]:
        assert alpha.get(f"/v1/batches/{batch_id}").json()["status"] not in (
            "cancelling", "cancelled")
        alpha.post(f"/v1/batches/{batch_id}/cancel")
    for job_id in ids["job"][3:]:
        alpha.delete(f"/v1/jobs/{job_id}")
    print(f"\n[faults] {probes} cross-tenant probes on {len(targets)} routes "
          f"({', '.join(sorted({p for _, p in targets}))}): {statuses}")
