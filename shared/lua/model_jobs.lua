-- model_jobs (catalogue: shared/catalogue_io.py, api/models_admin.py): one queued job of a
-- model, told about its model. ARGV[1] 'fail': it ends `failed` with the error ARGV[3] (a
-- load that failed max_load_tries times: model_load_failed; a model retired with its
-- queued jobs failed: model_retired). 'fail_orphan': the same, and also for a job still
-- `running` that no worker holds (no lease: a draining worker handed it back to a model
-- that has no worker left to take it). 'loading': its stream gets a `queued` event with
-- data ARGV[3] ({"reason": "loading"}). Nothing for a job that is no longer queued or is
-- another model's. Returns 1 when it acted, 0 otherwise.
--#include terminal
local job_key, events_key, running_key, lease_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode, model, data = ARGV[1], ARGV[2], ARGV[3]
local now, maxlen, default_ttl = ARGV[4], ARGV[5], ARGV[6]

local h = redis.call('HMGET', job_key, 'state', 'model')
if h[2] ~= model then return 0 end
local orphan = mode == 'fail_orphan' and h[1] == 'running'
  and redis.call('EXISTS', lease_key) == 0
if h[1] ~= 'queued' and not orphan then return 0 end
if mode == 'fail' or mode == 'fail_orphan' then
  leave_queue(job_key)
  end_job(job_key, events_key, running_key, 'failed', {finished_at = now, error = data},
          'error', data, now, default_ttl, maxlen)
  return 1
end
redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'queued', 'd', data)
redis.pcall('PUBLISH', events_key, '')  -- a hint for the API's readers (terminal.lua)
return 1
