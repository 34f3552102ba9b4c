-- fair_victims (worker's preemptor, fair share): which of this worker's running jobs of a
-- lane to hand back (preempt.lua with a ticket) so that the tenant the lane's next ticket
-- takes (its least-served backlogged tenant, pick.lua) gets a slot now instead of waiting
-- for one to free (docs/scheduling.md, "Fair share").
-- The running jobs (ARGV: this worker's, each still preemptable, the fewest times
-- preempted first, then the most recently started) name the tenants it could take a slot
-- from. The slots each tenant holds are
-- counted over every worker of the lane (`{lane}:held`, kept by leasing.lua and
-- terminal.lua). The victim is the first job here (in that order) of a tenant that either
-- - holds more slots per weight than the next tenant would with one more, and was served at
--   least as much (weighted) as it: the lane's slots are shared max-min by weight among
--   the tenants with work, and never taken from the less served; or
-- - was served more than MARGIN above the next tenant (log2 units: 0.5 = 1.4 times as
--   much, weighted): a tenant far behind (one that comes back after idling is at most
--   fair.lua's BANK behind) does not wait for a slot to free.
-- Of several, the most served (weighted): a light tenant's job is not sent back while a
-- heavy tenant's runs here.
-- `{lane}:ceded` counts the slots freed this way whose ticket no take has used yet
-- (pick.lua counts it down; it expires after `claim_ms`): while it is at the number of
-- backlogged tenants other than the victim's, nothing more is freed, so two workers do not
-- both free a slot for one waiting job, and several tenants waiting at once (a burst of
-- light ones) get theirs in parallel rather than one look-and-take after another.
-- Returns {'ok', job id}, {'claimed'} (one is owed a slot, a freed one is on its way),
-- {'none'}, or {'alone'}: the next tenant is the lane's only backlogged one and every job
-- here is its own, so no later look can find a victim either until news comes (a create
-- naming a new tenant) or these jobs change; the preemptor stops looking every poll.
--#include fair
local tenants_key, ceded_key, held_key = KEYS[1], KEYS[2], KEYS[3]
local claim_ms, now, half_s = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local MARGIN = 0.5  -- below fair.lua's BANK: a tenant that comes back preempts

local low = redis.call('ZRANGE', tenants_key, 0, 0, 'WITHSCORES')
if not low[1] then return {'none'} end
local next_tenant, next_score = low[1], tonumber(low[2])

local function weight(tenant)
  return tonumber(redis.call('HGET', '@SHARE_PREFIX@' .. tenant, 'weight')) or 1
end

local function held(tenant)
  return tonumber(redis.call('HGET', held_key, tenant)) or 0
end

local order, newest = {}, {}
for i = 4, #ARGV do
  local tenant = redis.call('HGET', '@JOB_PREFIX@' .. ARGV[i], 'lane_tenant')
  if tenant and not newest[tenant] then
    order[#order + 1] = tenant
    newest[tenant] = ARGV[i]
  end
end

local others = #order > 1 or (order[1] and order[1] ~= next_tenant)
if not others and redis.call('ZCARD', tenants_key) == 1 then return {'alone'} end

local owed = (held(next_tenant) + 1) / weight(next_tenant)
local victim, most = nil, nil
for _, tenant in ipairs(order) do
  if tenant ~= next_tenant then
    local load = held(tenant) / weight(tenant)
    local score = tonumber(redis.call('ZSCORE', tenants_key, tenant))
        or score_now('@SHARE_PREFIX@' .. tenant, now, half_s)
    if ((score >= next_score and load > owed) or score - next_score > MARGIN)
        and (most == nil or score > most) then
      victim, most = tenant, score
    end
  end
end
if not victim then return {'none'} end
-- one freed slot on its way per other backlogged tenant (each is owed at most one now)
local owed_slots = redis.call('ZCARD', tenants_key)
if redis.call('ZSCORE', tenants_key, victim) then owed_slots = owed_slots - 1 end
if (tonumber(redis.call('GET', ceded_key)) or 0) >= math.max(1, owed_slots) then
  return {'claimed'}
end
redis.call('INCR', ceded_key)
redis.call('PEXPIRE', ceded_key, claim_ms)
return {'ok', newest[victim]}
