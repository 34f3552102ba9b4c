-- position (api): a waiting job's position and eta now (eta.lua), for GET /v1/jobs/{id}
-- and the SSE stream's `queued` updates. Returns {position, eta in ms (-1: unknown)}, or
-- {} when the job is not queued. A job that waits behind a job-bound message (preempted,
-- handed back: it resumes first) and is in no tenant list counts only the higher lanes.
--#include fair
--#include eta
local job_key = KEYS[1]
local now, half_s, fifo = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local h = redis.call('HMGET', job_key, 'state', 'lane', 'lane_tenant', 'id', 'created_at',
                     'est_tokens')
if h[1] ~= 'queued' or not h[2] or not h[3] then return {} end
local index = redis.call('LPOS', h[2] .. ':t:' .. h[3], h[4])
local est = estimate(h[2], h[3], index or 0, tonumber(h[5]) or now, tonumber(h[6]) or 0,
                     now, half_s, fifo)
return {est[1], est[2] and math.floor(est[2] * 1000 + 0.5) or -1}
