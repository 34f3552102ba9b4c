-- file_reserve (api's uploads): reserve an upload's bytes against its tenant's quota and
-- hold the upload's lease while it is copied. Atomic, so parallel uploads of one tenant
-- cannot overshoot the quota between a check and a write.
-- The first call registers the upload (the tenant's file count is checked then, and
-- entries of uploads long gone without a trace are dropped); every call adds `add` bytes to
-- what the upload holds, only if the tenant's total stays within `quota` (0: none), and
-- pushes the upload's deadline in the uploads index to `lease_until`.
-- Returns {1, held}: reserved (the tenant's bytes now); {0, 'files', count}: too many
-- files; {0, 'bytes', held}: over the byte quota; {0, 'gone', 0}: the upload's lease ran
-- out (the sweeper took it) or it was dropped.
local bytes_key, uploads_key = KEYS[1], KEYS[2]
local file_id, tenant = ARGV[1], ARGV[2]
local add, quota, max_files = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now, lease_until, first = tonumber(ARGV[6]), ARGV[7], ARGV[8] == '1'
local member = file_id .. ':' .. tenant  -- keys.upload_member

local held = redis.call('ZRANGE', bytes_key, 0, -1, 'WITHSCORES')
if first then
  -- An entry with neither a file nor a place in the uploads index predates the index (or
  -- lost both): nothing will ever sweep it, so it stops counting here.
  local kept = {}
  for i = 1, #held, 2 do
    local other = held[i]
    if redis.call('EXISTS', '@FILE_PREFIX@' .. other) == 0
       and not redis.call('ZSCORE', uploads_key, other .. ':' .. tenant) then
      redis.call('ZREM', bytes_key, other)
    else
      kept[#kept + 1] = other
      kept[#kept + 1] = held[i + 1]
    end
  end
  held = kept
  if max_files > 0 and #held / 2 >= max_files then
    return {0, 'files', #held / 2}
  end
else
  local deadline = redis.call('ZSCORE', uploads_key, member)
  if not deadline or tonumber(deadline) <= now then
    return {0, 'gone', 0}
  end
end

local used = 0
for i = 2, #held, 2 do
  used = used + tonumber(held[i])
end
if add > 0 and quota > 0 and used + add > quota then
  return {0, 'bytes', used}
end
redis.call('ZINCRBY', bytes_key, add, file_id)
redis.call('ZADD', uploads_key, lease_until, member)
return {1, used + add}
