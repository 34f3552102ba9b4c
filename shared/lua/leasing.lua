-- The library of leasing a job (acquire.lua: a delivered job-bound message; pick.lua: a
-- ticket's take): see acquire.lua for what it does and answers.
local function lease_job(job_key, events_key, lease_key, running_key, worker, lease_ms,
                         max_attempts, now, maxlen, default_ttl)
  local state = redis.call('HGET', job_key, 'state')
  if not state then return {'missing'} end
  if is_terminal(state) then
    leave_queue(job_key)
    redis.call('HINCRBY', job_key, 'duplicates', 1)
    return {'terminal'}
  end
  if redis.call('EXISTS', lease_key) == 1 then
    redis.call('HINCRBY', job_key, 'duplicates', 1)
    return {'busy'}
  end
  leave_queue(job_key)

  local function fail(st, code, message)
    local err = cjson.encode({code = code, message = message})
    end_job(job_key, events_key, running_key, st, {finished_at = now, error = err}, 'error', err,
            now, default_ttl, maxlen)
  end
  local deadline = redis.call('HGET', job_key, 'deadline')
  if deadline and deadline ~= '' and tonumber(now) > tonumber(deadline) then
    fail('expired', 'expired', 'the job passed its deadline before it could run')
    return {'expired'}
  end
  -- A worker died compiling this job's grammar (workers/tasks.py guard_grammar marks the
  -- job meanwhile), or stalled applying it (workers/runtime.py marks it): the job is
  -- poison, failed here rather than killing or stalling the next worker.
  local probe = redis.call('HGET', job_key, 'grammar_probe')
  if probe then
    fail('failed', 'grammar_crashed', 'the worker died or stalled in the grammar of this ' ..
         "job's JSON schema (attempt " .. probe .. '); the job is not retried')
    return {'poison'}
  end
  local attempts = tonumber(redis.call('HGET', job_key, 'attempts') or '0')
  -- Preempted attempts, and attempts whose worker was alive to learn it lost them
  -- (renew_job.lua: `survivals`), are not losses of the job's making.
  local lost = attempts - tonumber(redis.call('HGET', job_key, 'preemptions') or '0')
               - tonumber(redis.call('HGET', job_key, 'survivals') or '0')
  if lost >= max_attempts then
    fail('failed', 'max_attempts',
         'the job was attempted ' .. lost .. ' times and its worker died each time')
    return {'exhausted'}
  end

  attempts = attempts + 1
  redis.call('HSET', job_key, 'state', 'running', 'attempts', attempts, 'worker', worker)
  redis.call('HDEL', job_key, 'msg')  -- delivered: a rescue needs a lost lease from now on
  if not redis.call('HGET', job_key, 'started_at') then
    redis.call('HSET', job_key, 'started_at', now)
  end
  redis.call('SET', lease_key, worker .. '|' .. attempts, 'PX', lease_ms)
  redis.call('ZADD', running_key, now, job_key)
  local h = redis.call('HMGET', job_key, 'lane', 'lane_tenant', 'held')
  if h[1] and h[2] and not h[3] then  -- counted once (a takeover's job is held already)
    redis.call('HSET', job_key, 'held', '1')
    redis.call('HINCRBY', h[1] .. ':held', h[2], 1)
  end
  redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'started',
             'd', cjson.encode({attempt = attempts, worker = worker}))
  redis.pcall('PUBLISH', events_key, '')  -- a hint for the API's readers (terminal.lua)
  return {'ok', attempts, redis.call('HGET', job_key, 'spec'),
          redis.call('HGET', job_key, 'cancel_requested') or '0'}
end
