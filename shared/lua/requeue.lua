-- requeue (worker's rescue): re-enqueue a job that no message will ever deliver:
-- - running without a lease (its worker died): a message that names it; the next
--   worker's acquire takes it over;
-- - queued with a message that names it (preempted, handed back) while that message is
--   neither in the queue nor in kombu's unacked hash. kombu pops a message (BRPOP) before
--   it records it as unacked, so a worker killed in between loses it;
-- - queued behind a ticket (create.lua): its id back at the head of its tenant's list if
--   it is not there (and the tenant back in the lane), and a ticket when the lane holds
--   fewer messages than waiting ids (a popped ticket lost the same way). Tickets are not
--   bound to jobs, so one too many is the worst case: it finds nothing (pick.lua) and is
--   acked. Without a ticket (''), such a job gets a message that names it instead.
-- A copy pushed while the old message was in flight only meets acquire's busy/terminal
-- check, so a rescue is at worst a duplicate that drops itself, never a second run.
-- Returns 1 re-enqueued, 0 nothing to do.
--#include fair
local job_key, lease_key, running_key, queue_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local unacked_key, queued_index = KEYS[5], KEYS[6]
local message, ticket, now, half_s, fifo = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]

local function push(msg)
  redis.call('RPUSH', queue_key, msg)  -- the consuming end: a rescue does not wait its turn
  redis.pcall('PUBLISH', queue_key, '')  -- news for the model's preemptors (workers/preempt.py)
  return 1
end

local state = redis.call('HGET', job_key, 'state')
if state ~= 'running' and state ~= 'queued' then
  redis.call('ZREM', running_key, job_key)
  redis.call('ZREM', queued_index, job_key)
  return 0
end
if state == 'running' and redis.call('EXISTS', lease_key) == 1 then return 0 end
local old = redis.call('HGET', job_key, 'msg')
local lane, tenant = redis.call('HGET', job_key, 'lane'), redis.call('HGET', job_key, 'lane_tenant')
if state == 'queued' and not old and lane and tenant and ticket ~= '' then
  local tenants_key, list_key = lane .. ':tenants', lane .. ':t:' .. tenant
  local job_id = redis.call('HGET', job_key, 'id')
  local listed = redis.call('LPOS', list_key, job_id)
  if not listed then redis.call('LPUSH', list_key, job_id) end
  enter(tenants_key, tenant, '@SHARE_PREFIX@' .. tenant, tonumber(now), half_s, fifo,
        redis.call('HGET', job_key, 'created_at') or now)
  if not listed then return push(ticket) end
  local waiting = 0
  for _, t in ipairs(redis.call('ZRANGE', tenants_key, 0, -1)) do
    waiting = waiting + redis.call('LLEN', lane .. ':t:' .. t)
  end
  if redis.call('LLEN', queue_key) >= waiting then return 0 end
  return push(ticket)
end
if old then
  local tag = cjson.decode(old)['properties']['delivery_tag']
  if redis.call('HEXISTS', unacked_key, tag) == 1 then return 0 end  -- delivered, not acked
  if redis.call('LPOS', queue_key, old, 'RANK', -1) then return 0 end  -- still queued
end
redis.call('HSET', job_key, 'msg', message)
return push(message)
