-- batch_cancel (api): mark a batch `cancelling` and hand it to a driver, in one step with
-- the look at its status: read first and written after, a cancel could land just after
-- the last line settled the batch `completed` and turn it into `cancelling` (then
-- `cancelled`, with a second webhook). Returns the status it found (false: no batch);
-- only `validating` and `in_progress` become `cancelling`.
local batch_key, pending_key = KEYS[1], KEYS[2]
local batch_id, now = ARGV[1], ARGV[2]

local status = redis.call('HGET', batch_key, 'status')
if status == 'validating' or status == 'in_progress' then
  redis.call('HSET', batch_key, 'status', 'cancelling', 'cancelling_at', now)
  redis.call('SADD', pending_key, batch_id)
end
return status
