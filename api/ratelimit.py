"""Per-tenant rate limits as token buckets in Redis, so they hold across API replicas.

Two buckets per tenant: requests/s (every authenticated request, charged in the auth
middleware) and tokens/min (prompt + max_tokens of each submitted job, charged in
service.submit). The `take` script (shared/lua/take.lua) refills and takes atomically on
Redis's clock; a refused request learns how long until it would fit (-> Retry-After).
"""

from __future__ import annotations

import math

import redis.asyncio as aioredis

from tokenq.api.errors import RateLimited
from tokenq.shared import keys
from tokenq.shared.lua_scripts import Scripts


class RateLimits:
    """The tenants' token buckets on one client."""

    def __init__(self, r: aioredis.Redis):
        self._scripts = Scripts(r, ("take",))

    async def take(self, tenant: str, kind: str, rate: float, burst: float,
                   cost: float) -> float:
        """Seconds to wait before this would be allowed (0: allowed, and charged)."""
        wait = await self._scripts["take"](keys=[keys.rate_bucket(tenant, kind)],
                                           args=[repr(rate), repr(burst), repr(cost)])
        return float(wait)

    async def charge_requests(self, tenant: str, rps: float, burst: int) -> None:
        if rps <= 0:
            return
        wait = await self.take(tenant, "rps", rps, burst or max(1.0, 2 * rps), 1)
        if wait > 0:
            raise RateLimited(f"over {rps:g} requests/s for this API key; retry later",
                              retry_after=max(1, math.ceil(wait)))

    async def charge_tokens(self, tenant: str, tpm: int, tokens: int) -> None:
        """Charge a job's prompt + max_tokens against the tenant's tokens/min."""
        if tpm <= 0:
            return
        if tokens > tpm:
            raise RateLimited(f"this job asks for {tokens} tokens (prompt + max_tokens), more "
                              f"than the {tpm} tokens/min allowed for this API key",
                              retry_after=60, code="tokens_per_min_exceeded")
        wait = await self.take(tenant, "tpm", tpm / 60.0, tpm, tokens)
        if wait > 0:
            raise RateLimited(f"over {tpm} tokens/min for this API key; retry later",
                              retry_after=max(1, math.ceil(wait)),
                              code="tokens_per_min_exceeded")
