-- file_drop (api's uploads): an upload's Redis side goes (record, content, its place in
-- the tenant's sets, so its quota is free) and its deadline in the uploads index becomes 0:
-- its copy on disk is the caller's to delete next, and the sweeper's if the caller dies
-- first. With `only_expired`, only an upload whose deadline has passed (the sweeper).
-- Returns 1 dropped, 0 not yet due.
local uploads_key, file_key, data_key, files_key, bytes_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local member, file_id, now, only_expired =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'

local deadline = redis.call('ZSCORE', uploads_key, member)
if only_expired and deadline and tonumber(deadline) > now then
  return 0
end
redis.call('DEL', file_key, data_key)
redis.call('ZREM', files_key, file_id)
redis.call('ZREM', bytes_key, file_id)
if deadline then
  redis.call('ZADD', uploads_key, 0, member)
end
return 1
