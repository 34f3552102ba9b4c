-- cancel (api): a queued job ends `cancelled` at once; a running one gets
-- cancel_requested=1 (its worker stops it). Returns the job's state before (`cancelled`
-- for a queued job cancelled here), or false for a missing job.
--#include terminal
local job_key, events_key, running_key = KEYS[1], KEYS[2], KEYS[3]
local now, maxlen, default_ttl = ARGV[1], ARGV[2], ARGV[3]

local state = redis.call('HGET', job_key, 'state')
if not state then return false end
if state == 'queued' then
  leave_queue(job_key)
  end_job(job_key, events_key, running_key, 'cancelled',
          {finished_at = now, cancel_requested = '1'}, 'cancelled', '{}', now, default_ttl,
          maxlen)
  return 'cancelled'
end
if state == 'running' then redis.call('HSET', job_key, 'cancel_requested', '1') end
return state
