"""Idempotency-Key on POST /v1/jobs and POST /v1/batches.

A client that lost an answer (timeout, dropped connection, replica gone) retries with
the same key and gets the object its first request made, not a second one. Stripe's and
the IETF draft's rules:

- same key, same tenant, same body: the first request's object again (202/200 as the
  first time, header `Idempotent-Replayed: true`), for `idempotency_ttl_s` (24 h);
- same key with another body: 422 `idempotency_key_reused` (the draft's choice: the
  request is well-formed but cannot be processed as a replay);
- a batch whose first request is still being written: 409 `idempotency_key_in_progress`.

Keys are per tenant: two tenants using the same key never see each other's objects.
For jobs the key is written by the create script (shared/lua/create.lua) in the same
atomic step as the job.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tokenq.api.errors import IdempotencyKeyReused, InvalidRequest
from tokenq.shared import keys

MAX_KEY_LEN = 255


@dataclass(frozen=True, slots=True)
class Idem:
    """An Idempotency-Key as stored: its Redis key and the body's hash."""

    redis_key: str
    body_sha: str


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def of(tenant: str, kind: str, key: str | None, body: Any) -> Idem | None:
    """None without a key; 400 for a key that is empty or too long."""
    if key is None:
        return None
    if not key.strip() or len(key) > MAX_KEY_LEN:
        raise InvalidRequest(f"Idempotency-Key must be 1..{MAX_KEY_LEN} characters",
                             param="Idempotency-Key")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Idem(keys.idempotency(tenant, kind, sha256(key)), sha256(canonical))


def split(stored: str) -> tuple[str, str]:
    obj_id, _, body_sha = stored.partition("|")
    return obj_id, body_sha


def key_reused() -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        "this Idempotency-Key was used with a different request body; use a new key "
        "for a new request", param="Idempotency-Key")


def check_same_body(idem: Idem, stored_sha: str) -> None:
    if stored_sha != idem.body_sha:
        raise key_reused()
