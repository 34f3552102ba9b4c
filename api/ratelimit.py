"""Per-tenant rate limits as token buckets in Redis, so they hold across API replicas.

Two buckets per tenant: requests/s (every authenticated request, charged in the auth
middleware) and tokens/min (prompt + max_tokens of each submitted job, charged in
service.submit). One Lua script refills and takes atomically on Redis's clock; a refused
request learns how long until it would fit (-> Retry-After).
"""

from __future__ import annotations

import math

import redis.asyncio as aioredis

from shared import keys
from shared.errors import RateLimited

# KEYS: bucket; ARGV: rate per second, burst (capacity), cost.
# Returns "0" when taken, else the seconds until `cost` would fit.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
level = math.min(burst, level + math.max(0, now - ts) * rate)
local wait = 0
if level >= cost then level = level - cost else wait = (cost - level) / rate end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""


async def take(r: aioredis.Redis, tenant: str, kind: str, rate: float, burst: float,
               cost: float) -> float:
    """Seconds to wait before this would be allowed (0: allowed, and charged)."""
    wait = await r.eval(TAKE, 1, keys.rate_bucket(tenant, kind), repr(rate), repr(burst),
                        repr(cost))
    return float(wait)


async def charge_requests(r: aioredis.Redis, tenant: str, rps: float, burst: int) -> None:
    if rps <= 0:
        return
    wait = await take(r, tenant, "rps", rps, burst or max(1.0, 2 * rps), 1)
    if wait > 0:
        raise RateLimited(f"over {rps:g} requests/s for this API key; retry later",
                          retry_after=max(1, math.ceil(wait)))


async def charge_tokens(r: aioredis.Redis, tenant: str, tpm: int, tokens: int) -> None:
    """Charge a job's prompt + max_tokens against the tenant's tokens/min."""
    if tpm <= 0:
        return
    if tokens > tpm:
        raise RateLimited(f"this job asks for {tokens} tokens (prompt + max_tokens), more than "
                          f"the {tpm} tokens/min allowed for this API key", retry_after=60,
                          code="tokens_per_min_exceeded")
    wait = await take(r, tenant, "tpm", tpm / 60.0, tpm, tokens)
    if wait > 0:
        raise RateLimited(f"over {tpm} tokens/min for this API key; retry later",
                          retry_after=max(1, math.ceil(wait)), code="tokens_per_min_exceeded")
