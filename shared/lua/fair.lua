-- The library of fair share between a lane's tenants (docs/scheduling.md, "Fair share"),
-- included by the scripts that put jobs in a lane, take them or end them. A tenant's
-- share hash holds `served` (tokens served, prompt + output, decayed: halved every
-- `half_s`), `at` (when `served` was last written) and `weight` (its key entry's, written
-- by every create). A lane's tenants zset scores each backlogged tenant by
-- log2(served / weight) + at / half_s: decay lowers every tenant's log by the same amount
-- as time passes, so scores written at different times compare as if all were decayed to
-- the same moment, and nobody is re-scored for time alone. FIFO (`fair_share = false`):
-- the score is the tenant's oldest waiting job's creation time (arrival order).

local LOG2 = math.log(2)

local function num(x) return string.format('%.17g', x) end

-- The tenant's service decayed to `now`, and its weight (1 when none was written).
local function served_now(share_key, now, half_s)
  local h = redis.call('HMGET', share_key, 'served', 'at', 'weight')
  local served, at = tonumber(h[1]) or 0, tonumber(h[2]) or now
  if now > at then served = served * 2 ^ (-(now - at) / half_s) end
  return served, tonumber(h[3]) or 1
end

-- The score of `served` (at `now`); service below one token counts as one.
local function share_score(served, weight, now, half_s)
  return math.log(math.max(served, 1) / weight) / LOG2 + now / half_s
end

-- The tenant's score now (its service decayed to `now`, weighted).
local function score_now(share_key, now, half_s)
  local served, weight = served_now(share_key, now, half_s)
  return share_score(served, weight, now, half_s)
end

-- Write the tenant's service (never below 0). Kept 40 half-lives: decayed to nothing.
local function set_served(share_key, served, now, half_s)
  redis.call('HSET', share_key, 'served', num(math.max(served, 0)), 'at', num(now))
  redis.call('EXPIRE', share_key, math.ceil(40 * half_s))
end

-- Add `tokens` (negative: a correction) to the tenant's service; its new score.
local function charge(share_key, tokens, now, half_s)
  local served, weight = served_now(share_key, now, half_s)
  served = math.max(served + tokens, 0)
  set_served(share_key, served, now, half_s)
  return share_score(served, weight, now, half_s)
end

-- The lowest score among the lane's tenants with work other than `tenant`: those
-- backlogged (the zset) and those running a job of the lane with nothing waiting
-- (`{lane}:held`, read only while it names at most HELD_LOOKED tenants: beyond that, the
-- backlogged alone). nil when there are none.
local HELD_LOOKED = 64
local function lowest_with_work(tenants_key, tenant, now, half_s)
  local low = redis.call('ZRANGE', tenants_key, 0, 0, 'WITHSCORES')[2]
  low = low and tonumber(low)
  local held_key = string.sub(tenants_key, 1, -9) .. ':held'  -- {lane}:tenants -> :held
  if redis.call('HLEN', held_key) > HELD_LOOKED then return low end
  for _, other in ipairs(redis.call('HKEYS', held_key)) do
    if other ~= tenant then
      local score = score_now('@SHARE_PREFIX@' .. other, now, half_s)
      if not low or score < low then low = score end
    end
  end
  return low
end

-- The tenant's list just got work while it was not backlogged: it joins the lane at its
-- own score, or at most BANK below the lowest score of the tenants with work (its service
-- raised to half that tenant's), so idling banks little credit: it goes first until it
-- has caught up with half the service of the least served of those being served or
-- waiting, and it is then behind nobody who was served less. fair_victims.lua frees a
-- slot for it while it is that far behind. Counting the running tenants keeps the light
-- tenants' own service apart beside a heavy one: measured against the heavy tenant alone
-- (the only one waiting), every light tenant that came back would be raised to half the
-- heavy one's service, and their scores would say when each came back, not how much each
-- was served. FIFO: at `created`.
local BANK = 1  -- log2 units
local function enter(tenants_key, tenant, share_key, now, half_s, fifo, created)
  if redis.call('ZSCORE', tenants_key, tenant) then return end
  if fifo == '1' then
    redis.call('ZADD', tenants_key, created, tenant)
    return
  end
  local served, weight = served_now(share_key, now, half_s)
  local own = share_score(served, weight, now, half_s)
  local low = lowest_with_work(tenants_key, tenant, now, half_s)
  -- (a raise to less than one token is none: a score at the floor reads as no service)
  local raised = low and weight * 2 ^ (tonumber(low) - BANK - now / half_s)
  if raised and raised >= 1 and tonumber(low) - BANK > own then
    own = tonumber(low) - BANK
    set_served(share_key, raised, now, half_s)
  end
  redis.call('ZADD', tenants_key, num(own), tenant)
end

-- After a take from the tenant's list: out of the lane when the list is empty, else at
-- `score` (fair) or at its new oldest job's creation time (FIFO).
local function rescore(tenants_key, tenant, list_key, score, fifo)
  local head = redis.call('LINDEX', list_key, 0)
  if not head then
    redis.call('ZREM', tenants_key, tenant)
  elseif fifo == '1' then
    local created = redis.call('HGET', '@JOB_PREFIX@' .. head, 'created_at')
    if created then redis.call('ZADD', tenants_key, created, tenant) end
  elseif score then
    redis.call('ZADD', tenants_key, num(score), tenant)
  end
end

-- A take used a slot the preemptor freed for the lane (fair_victims.lua), if one was owed.
local function used_ceded(ceded_key)
  local n = tonumber(redis.call('GET', ceded_key))
  if not n then return end
  if n <= 1 then redis.call('DEL', ceded_key) else redis.call('DECR', ceded_key) end
end
