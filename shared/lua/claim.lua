-- claim (worker's webhook sender): take up to `limit` due events from the outbox by
-- pushing their score `lease_s` forward (if this worker dies, they are due again then).
-- Returns {the claimed event ids, when the next event is due (its score; false: none)}:
-- a sender with nothing to do waits on the bell until then.
local outbox_key = KEYS[1]
local now, lease_s, limit = ARGV[1], ARGV[2], ARGV[3]

local ids = redis.call('ZRANGEBYSCORE', outbox_key, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do redis.call('ZADD', outbox_key, now + lease_s, id) end
local next_due = redis.call('ZRANGE', outbox_key, 0, 0, 'WITHSCORES')[2] or false
return {ids, next_due}
