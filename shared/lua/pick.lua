-- pick (worker): a ticket's take, one atomic step (docs/scheduling.md). The lane's
-- backlogged tenant with the lowest score (fair: least weighted decayed service; FIFO:
-- oldest waiting job) gives its oldest job id; that job is leased as acquire.lua leases
-- a delivered one, its tenant charged its estimate (`est_tokens`: prompt + max_tokens,
-- corrected by finish.lua) and re-scored, or taken out of the lane when its list is empty;
-- the pool's pace is noted (eta.lua).
-- Ids whose job is no longer queued (cancelled, expired, taken by a job-bound message)
-- are skipped, at most MAX_SKIP per step. Returns {'ok', job id, attempt, spec,
-- cancel_requested}; {reason, job id} when the job was not run (acquire.lua's reasons);
-- {'empty'} (no job waits: the ticket's job was cancelled, or taken by an earlier ticket)
-- or {'stale'} (only skipped ids this step; the tickets of those jobs remain).
-- A direct take (`queue_key` and `mark` given: a preempted job's slot thread taking the job
-- it was freed for, workers/tasks.py): the ticket at the queue's consuming end is taken off
-- here, as if Celery had delivered it to this thread (`mark` is in every ticket of the
-- lane and in no message that names a job); {'no_ticket'} and nothing changed when that
-- end holds no ticket, or a higher lane's queue (KEYS[4..]) holds a message: Celery
-- consumes those first.
--#include terminal
--#include leasing
--#include fair
--#include eta
local tenants_key, running_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local lane, worker, lease_ms, max_attempts = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local now, maxlen, default_ttl = ARGV[5], ARGV[6], ARGV[7]
local half_s, fifo, mark = tonumber(ARGV[8]), ARGV[9], ARGV[10]

local MAX_SKIP = 64
local t_now = tonumber(now)

if queue_key and mark and mark ~= '' then
  for i = 4, #KEYS do
    if redis.call('LLEN', KEYS[i]) > 0 then return {'no_ticket'} end
  end
  local tail = redis.call('LINDEX', queue_key, -1)
  if not tail or not string.find(tail, mark, 1, true) then return {'no_ticket'} end
  redis.call('RPOP', queue_key)
end

for _ = 1, MAX_SKIP do
  local tenant = redis.call('ZRANGE', tenants_key, 0, 0)[1]
  if not tenant then
    redis.call('INCR', lane .. ':empty')  -- tickets that found nothing (redelivered, cancelled)
    return {'empty'}
  end
  local list_key = lane .. ':t:' .. tenant
  local job_id = redis.call('LPOP', list_key)
  local job_key = job_id and ('@JOB_PREFIX@' .. job_id)
  if job_key and redis.call('HGET', job_key, 'state') == 'queued' then
    local got = lease_job(job_key, job_key .. ':events', job_key .. ':lease', running_key,
                          worker, lease_ms, max_attempts, now, maxlen, default_ttl)
    local score = nil
    if got[1] == 'ok' then
      local est = tonumber(redis.call('HGET', job_key, 'est_tokens')) or 0
      redis.call('HSET', job_key, 'charged', est)
      score = charge('@SHARE_PREFIX@' .. tenant, est, t_now, half_s)
    end
    rescore(tenants_key, tenant, list_key, score, fifo)
    if got[1] == 'ok' then
      note_take(lane, t_now)
      used_ceded(lane .. ':ceded')
    end
    if got[1] ~= 'ok' then return {got[1], job_id} end
    return {'ok', job_id, got[2], got[3], got[4]}
  end
  rescore(tenants_key, tenant, list_key, nil, fifo)
end
return {'stale'}
