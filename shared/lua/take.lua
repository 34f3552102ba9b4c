-- take (api's rate limits): refill a token bucket on Redis's clock and take `cost` from
-- it if it holds that much. Returns "0" when taken, else the seconds until it would fit.
local bucket_key = KEYS[1]
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local b = redis.call('HMGET', bucket_key, 'level', 'ts')
local level = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
level = math.min(burst, level + math.max(0, now - ts) * rate)
local wait = 0
if level >= cost then level = level - cost else wait = (cost - level) / rate end
redis.call('HSET', bucket_key, 'level', tostring(level), 'ts', tostring(now))
redis.call('EXPIRE', bucket_key, math.ceil(burst / rate) + 1)
return tostring(wait)
