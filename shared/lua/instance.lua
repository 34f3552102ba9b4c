-- instance (autoscaler): claim, or renew, one of a catalogue model's `max_workers`
-- instance leases before a pool starts a worker for it, so that every pool together runs
-- at most that many (cli/autoscale_catalogue.py). The lease set is a zset, owner ->
-- expiry (ms, on Redis' clock: the pools' clocks may differ); leases past their expiry
-- (a pool that died without letting go) are dropped first. A pool releases a lease (ZREM)
-- when its worker exits. Returns 1: held (claimed or renewed), 0: every lease is taken.
local leases = KEYS[1]
local owner, max_n, ttl_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', leases, '-inf', now_ms)
if not redis.call('ZSCORE', leases, owner) and redis.call('ZCARD', leases) >= max_n then
  return 0
end
redis.call('ZADD', leases, now_ms + ttl_ms, owner)
redis.call('PEXPIRE', leases, ttl_ms * 2)
return 1
