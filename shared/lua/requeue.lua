-- requeue (worker's rescue): re-enqueue a job that no message will ever deliver:
-- - running without a lease (its worker died): the next worker's acquire takes it over;
-- - queued, or requeued, while its last message is neither in the queue nor in kombu's
--   unacked hash. kombu pops a message (BRPOP) before it records it as unacked, so a
--   worker killed in between loses it; without this the job would wait forever.
-- A copy pushed while the old message was in flight only meets acquire's busy/terminal
-- check, so a rescue is at worst a duplicate that drops itself, never a second run.
-- Returns 1 re-enqueued, 0 nothing to do.
local job_key, lease_key, running_key, queue_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unacked_key, queued_index = KEYS[5], KEYS[6]
local message = ARGV[1]

local state = redis.call('HGET', job_key, 'state')
if state ~= 'running' and state ~= 'queued' then
  redis.call('ZREM', running_key, job_key)
  redis.call('ZREM', queued_index, job_key)
  return 0
end
if state == 'running' and redis.call('EXISTS', lease_key) == 1 then return 0 end
local old = redis.call('HGET', job_key, 'msg')
if old then
  local tag = cjson.decode(old)['properties']['delivery_tag']
  if redis.call('HEXISTS', unacked_key, tag) == 1 then return 0 end  -- delivered, not acked
  if redis.call('LPOS', queue_key, old, 'RANK', -1) then return 0 end  -- still queued
end
redis.call('HSET', job_key, 'msg', message)
redis.call('RPUSH', queue_key, message)  -- the consuming end: a takeover does not wait its turn
redis.pcall('PUBLISH', queue_key, '')  -- news for the model's preemptors (workers/preempt.py)
return 1
