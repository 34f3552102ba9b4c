-- preempt (worker): a running job makes room for a waiting job of a higher priority, only
-- while the lease is still ours. Its tokens stay in its stream; it goes back to `queued`
-- (a `queued` event, position null) with its message at its queue's consuming end, and
-- `preemptions` + 1. The next attempt's acquire continues it after those tokens, as a
-- takeover does (no gap, no duplicate), and does not count preempted attempts against
-- max_attempts.
-- With a `ticket` (fair share: the slot goes to a tenant of its own lane with less weighted
-- service, fair_victims.lua) the job goes back to the head of its tenant's list instead, its
-- tenant back among the lane's backlogged (enter: a score it has there stays), its charge
-- refunded (the take that resumes it charges it again, finish.lua corrects that one), and
-- the ticket goes to the far end of the queue: the freed slot takes the lane's least-served
-- tenant's job, and this one resumes at its tenant's turn.
-- Returns 1 preempted, 0 not ours (a newer attempt's, or no longer running).
--#include terminal
--#include fair
local job_key, lease_key, queue_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local running_key, queued_index = KEYS[5], KEYS[6]
local lease, message, now, maxlen, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ticket, half_s, fifo = ARGV[6], tonumber(ARGV[7]), ARGV[8]

if redis.call('HGET', job_key, 'state') ~= 'running' then return 0 end
local cur = redis.call('GET', lease_key)
-- No lease at all (it expired while Redis was away, e.g. a failover) but no newer attempt
-- took the job: still ours, as renew_job.lua takes it back.
if cur ~= lease and (cur or redis.call('HGET', job_key, 'attempts') ~= attempt) then
  return 0
end
redis.call('DEL', lease_key)
redis.call('HSET', job_key, 'state', 'queued')
redis.call('HINCRBY', job_key, 'preemptions', 1)
redis.call('ZREM', running_key, job_key)
unhold(job_key)
redis.call('ZADD', queued_index, now, job_key)  -- a lost message is rescued (requeue.lua)
local lane, tenant = redis.call('HGET', job_key, 'lane'), redis.call('HGET', job_key, 'lane_tenant')
if ticket ~= '' and lane and tenant then
  local t_now, share_key = tonumber(now), '@SHARE_PREFIX@' .. tenant
  local charged = tonumber(redis.call('HGET', job_key, 'charged'))
  if charged then
    redis.call('HDEL', job_key, 'charged')
    charge(share_key, -charged, t_now, half_s)
  end
  redis.call('HDEL', job_key, 'msg')  -- behind a ticket again (requeue.lua's rescue)
  redis.call('LPUSH', lane .. ':t:' .. tenant, redis.call('HGET', job_key, 'id'))
  -- a backlogged tenant keeps its score in the lane (its next take writes it anew): lowered
  -- by the refund, it would take back the slot just freed for another
  enter(lane .. ':tenants', tenant, share_key, t_now, half_s, fifo,
        redis.call('HGET', job_key, 'created_at') or now)
  redis.call('LPUSH', queue_key, ticket)  -- the far end: the lane's order decides
else
  redis.call('HSET', job_key, 'msg', message)
  redis.call('RPUSH', queue_key, message)  -- the consuming end: first of its lane to resume
end
redis.pcall('PUBLISH', queue_key, '')  -- news for the model's preemptors (workers/preempt.py)
redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'queued',
           'd', cjson.encode({position = cjson.null}))
redis.pcall('PUBLISH', events_key, '')  -- a hint for the API's readers (terminal.lua)
return 1
