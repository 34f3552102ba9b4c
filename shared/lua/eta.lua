-- The library of a waiting job's position and eta (docs/scheduling.md, "Position and
-- ETA"), included by create.lua (the `queued` event at enqueue), position.lua (GET
-- /v1/jobs/{id}, the SSE stream's updates) and pick.lua (the pool's measured rate). Needs
-- fair.lua (num). Bounded: at most ETA_TENANTS other tenants of the lane are looked at, a
-- few calls each (FIFO: a binary search of their lists, by creation time).
-- position: the jobs that would be taken before it: the higher lanes' waiting jobs
-- (tickets), its own tenant's jobs ahead of it, and for each other backlogged tenant of
-- its lane the jobs of theirs taken before its turn: fair share, those whose tenant's
-- weighted service (its score, plus one charge per job at its head job's estimate) stays
-- below its own tenant's at its turn; FIFO, those created before it.
-- eta_s: (position + 1/2) x the pool's mean gap between takes made while work waited
-- (the last ETA_GAPS, `{pool}:gaps`, noted by pick.lua), 0 for the first job of an idle
-- pool (until it has waited ETA_FREE_S: then no slot was free after all, and the pace
-- says when one frees), nil while no gap was measured.

local ETA_TENANTS = 200
local ETA_GAPS = 64
local ETA_FREE_S = 1.0
local ETA_HIGHER = {high = {}, normal = {'high'}, low = {'high', 'normal'}}

-- tokenq:lane:{pool}:{priority} -> tokenq:lane:{pool}, {priority}
local function pool_of(lane)
  local pool, prio = string.match(lane, '^(.*):([^:]+)$')
  return pool or lane, prio or ''
end

local function weight_of(tenant)
  return tonumber(redis.call('HGET', '@SHARE_PREFIX@' .. tenant, 'weight')) or 1
end

-- A score as service decayed to `now` (fair.lua's share_score, inverted; a score at its
-- floor, one token, as none: charges add to the service, not to the floor).
local function served_of(score, weight, now, half_s)
  local served = weight * 2 ^ (score - now / half_s)
  if served < 1 + 1e-9 then return 0 end
  return served
end

-- The ids of `list_key` (oldest first) created before `created`.
local function older_in(list_key, created)
  local lo, hi = 0, redis.call('LLEN', list_key)
  for _ = 1, 40 do
    if lo >= hi then break end
    local mid = math.floor((lo + hi) / 2)
    local id = redis.call('LINDEX', list_key, mid)
    local c = id and tonumber(redis.call('HGET', '@JOB_PREFIX@' .. id, 'created_at'))
    if c and c < created then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Jobs taken before the job at `index` in `tenant`'s list of `lane` (est: its estimate).
local function lane_ahead(lane, tenant, index, created, est, now, half_s, fifo)
  local tenants_key = lane .. ':tenants'
  local ahead, x, turn, own = index, nil, nil, nil
  if fifo ~= '1' then
    own = tonumber(redis.call('ZSCORE', tenants_key, tenant))
    if not own then return ahead end
    turn = own
    local w = weight_of(tenant)
    x = (served_of(own, w, now, half_s) + index * math.max(est, 1)) / w
    -- its tenant's score at its turn (as fair.lua's share_score writes it)
    if index > 0 then turn = math.log(math.max(x * w, 1) / w) / LOG2 + now / half_s end
  end
  local rows = redis.call('ZRANGE', tenants_key, 0, ETA_TENANTS - 1, 'WITHSCORES')
  for i = 1, #rows, 2 do
    local other, score = rows[i], tonumber(rows[i + 1])
    local list_key = lane .. ':t:' .. other
    if other == tenant then  -- luacheck: ignore 542
    elseif fifo == '1' then
      ahead = ahead + older_in(list_key, created)
    elseif score < turn or (score == turn and other < tenant) then
      -- its head job goes first (the zset orders ties by name), and each next one while
      -- its tenant's service then stays below ours
      local w = weight_of(other)
      local head = redis.call('LINDEX', list_key, 0)
      local e = head and tonumber(redis.call('HGET', '@JOB_PREFIX@' .. head, 'est_tokens'))
      e = math.max(e or est, 1)
      local q = (w * x - served_of(score, w, now, half_s)) / e
      local k, m = math.ceil(q), math.floor(q + 0.5)
      if math.abs(q - m) < 1e-6 then  -- a tie in service: the earlier charged goes first
        k = m + (((score < own) or (score == own and other < tenant)) and 1 or 0)
      end
      k = math.max(1, k)
      ahead = ahead + math.min(redis.call('LLEN', list_key), k)
    end
  end
  return ahead
end

-- {position, eta_s or nil} of the job at `index` of `tenant`'s list in `lane`.
local function estimate(lane, tenant, index, created, est, now, half_s, fifo)
  local pool, prio = pool_of(lane)
  local ahead = lane_ahead(lane, tenant, index, created, est, now, half_s, fifo)
  local prefix, model = string.match(pool, '^(.-):lane:(.*)$')
  for _, p in ipairs(ETA_HIGHER[prio] or {}) do
    if prefix then ahead = ahead + redis.call('LLEN', prefix .. '.' .. model .. '.' .. p) end
  end
  local busy = redis.call('HGET', pool .. ':rate', 'busy')
  if ahead == 0 and busy ~= '1' and now - created < ETA_FREE_S then return {ahead, 0} end
  local gaps = redis.call('LRANGE', pool .. ':gaps', 0, ETA_GAPS - 1)
  if #gaps == 0 then return {ahead, nil} end
  local sum = 0
  for _, g in ipairs(gaps) do sum = sum + tonumber(g) end
  return {ahead, (ahead + 0.5) * sum / #gaps}
end

-- A take from `lane` at `now`: the gap since the pool's previous take joins its last
-- ETA_GAPS when work waited then (the take was bound by the pool's pace, not by arrivals).
local function note_take(lane, now)
  local pool = pool_of(lane)
  local key, gaps = pool .. ':rate', pool .. ':gaps'
  local h = redis.call('HMGET', key, 'at', 'busy')
  if h[2] == '1' and h[1] then
    redis.call('LPUSH', gaps, num(math.max(now - tonumber(h[1]), 0)))
    redis.call('LTRIM', gaps, 0, ETA_GAPS - 1)
    redis.call('EXPIRE', gaps, 86400)
  end
  local busy = '0'
  for _, p in ipairs({'high', 'normal', 'low'}) do
    if redis.call('EXISTS', pool .. ':' .. p .. ':tenants') == 1 then busy = '1' end
  end
  redis.call('HSET', key, 'at', num(now), 'busy', busy)
  redis.call('EXPIRE', key, 86400)
end
