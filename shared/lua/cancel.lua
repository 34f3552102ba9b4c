-- cancel (api): a queued job ends `cancelled` at once; a running one gets
-- cancel_requested=1 (its worker stops it), unless `queued_only` is '1' (a batch's cancel,
-- api/openai/batch_driver.py: its running lines finish): then it is left as it is. The
-- state is checked and the job ended in this one step, so a job leased meanwhile is never
-- cut off. Returns the job's state before (`cancelled` for a queued job cancelled here,
-- `left` for a running one left to finish), or false for a missing job.
--#include terminal
local job_key, events_key, running_key = KEYS[1], KEYS[2], KEYS[3]
local now, maxlen, default_ttl, queued_only = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local state = redis.call('HGET', job_key, 'state')
if not state then return false end
if state == 'queued' then
  leave_queue(job_key)
  end_job(job_key, events_key, running_key, 'cancelled',
          {finished_at = now, cancel_requested = '1'}, 'cancelled', '{}', now, default_ttl,
          maxlen)
  return 'cancelled'
end
if state == 'running' then
  if queued_only == '1' then return 'left' end
  redis.call('HSET', job_key, 'cancel_requested', '1')
end
return state
