-- preempt (worker): a running job makes room for a waiting job of a higher priority, only
-- while the lease is still ours. Its tokens stay in its stream; it goes back to `queued`
-- (a `queued` event, position null) with its message at its queue's consuming end, and
-- `preemptions` + 1. The next attempt's acquire continues it after those tokens, as a
-- takeover does (no gap, no duplicate), and does not count preempted attempts against
-- max_attempts. Returns 1 preempted, 0 not ours (a newer attempt's, or no longer running).
local job_key, lease_key, queue_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local running_key, queued_index = KEYS[5], KEYS[6]
local lease, message, now, maxlen, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call('HGET', job_key, 'state') ~= 'running' then return 0 end
local cur = redis.call('GET', lease_key)
-- No lease at all (it expired while Redis was away, e.g. a failover) but no newer attempt
-- took the job: still ours, as renew_job.lua takes it back.
if cur ~= lease and (cur or redis.call('HGET', job_key, 'attempts') ~= attempt) then
  return 0
end
redis.call('DEL', lease_key)
redis.call('HSET', job_key, 'state', 'queued', 'msg', message)
redis.call('HINCRBY', job_key, 'preemptions', 1)
redis.call('ZREM', running_key, job_key)
redis.call('ZADD', queued_index, now, job_key)  -- a lost message is rescued (requeue.lua)
redis.call('RPUSH', queue_key, message)  -- the consuming end: first of its lane to resume
redis.pcall('PUBLISH', queue_key, '')  -- news for the model's preemptors (workers/preempt.py)
redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'queued',
           'd', cjson.encode({position = cjson.null}))
redis.pcall('PUBLISH', events_key, '')  -- a hint for the API's readers (terminal.lua)
return 1
