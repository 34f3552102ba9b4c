-- finish (worker): running -> succeeded | failed | cancelled with its terminal event, once,
-- and only for the attempt that still holds the job. With `tokens` (the stream's token
-- count the writer has sent, '' = unchecked) the job ends only once its stream holds them
-- all: after a Redis failover lost some, the writer re-sends them first, so the terminal
-- record's output is the concatenated stream.
-- A job a ticket took (pick.lua: `charged`, its estimate) corrects its tenant's service to
-- what ran: prompt + the stream's tokens (fair.lua).
-- Returns {1, n} ended, {0, n} fenced off, {2, n} not ended: the stream has only n tokens.
--#include terminal
--#include fair
local job_key, events_key, lease_key, running_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempt, state, fields_json, event, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local maxlen, default_ttl, tokens = ARGV[6], ARGV[7], ARGV[8]
local half_s, fifo, t_now = tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11])

-- The charge at take was prompt + max_tokens; the job ran prompt + n tokens.
local function correct(n, now)
  local h = redis.call('HMGET', job_key, 'charged', 'prompt_tokens', 'lane', 'lane_tenant')
  if not h[1] or not h[4] then return end
  redis.call('HDEL', job_key, 'charged')
  local ran = (tonumber(h[2]) or 0) + n
  local score = charge('@SHARE_PREFIX@' .. h[4], ran - tonumber(h[1]), now, half_s)
  if fifo ~= '1' and redis.call('ZSCORE', h[3] .. ':tenants', h[4]) then
    redis.call('ZADD', h[3] .. ':tenants', num(score), h[4])
  end
end

local n = tonumber(redis.call('HGET', job_key, 'n_tokens') or '0')
if redis.call('HGET', job_key, 'attempts') ~= attempt then return {0, n} end
if redis.call('HGET', job_key, 'state') ~= 'running' then return {0, n} end
if tokens ~= '' and n < tonumber(tokens) then return {2, n} end
-- An attempt ends `cancelled` only when someone asked (cancel.lua: cancel_requested). A
-- cancel the engine applied to this attempt though it was meant for an older one of the
-- same job (fenced off while the worker had already taken the job again) must not end the
-- job: the attempt lets go of its lease instead, and a takeover continues the job.
if state == 'cancelled' and redis.call('HGET', job_key, 'cancel_requested') ~= '1' then
  redis.call('DEL', lease_key)
  return {0, n}
end
local fields = cjson.decode(fields_json)
redis.call('DEL', lease_key)
end_job(job_key, events_key, running_key, state, fields, event, data,
        fields['finished_at'] or '0', default_ttl, maxlen)
if half_s then correct(n, t_now) end
return {1, n}
