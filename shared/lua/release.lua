-- release (api's batch driver): nothing is left for a driver once every line is enqueued
-- and a cancel (if any) has swept the queued ones: the job scripts settle the batch when
-- its last running line ends. Atomic, so a cancel that lands meanwhile keeps the batch
-- pending. Returns 1 released (out of the pending set), 0 still pending.
local batch_key, pending_key = KEYS[1], KEYS[2]
local batch_id = ARGV[1]

local b = redis.call('HMGET', batch_key, 'status', 'enqueue_done', 'swept')
local terminal = b[1] == 'completed' or b[1] == 'failed' or b[1] == 'expired'
                 or b[1] == 'cancelled'
if not terminal then
  if b[2] ~= '1' then return 0 end
  if b[1] == 'cancelling' and b[3] ~= '1' then return 0 end
end
redis.call('SREM', pending_key, batch_id)
return 1
