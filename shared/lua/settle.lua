-- settle (api's batch driver): settle a batch whose lines all ended before its driver
-- finished enqueuing them (or that had none left to enqueue after a cancel).
-- Returns the batch's status, or false for a missing batch.
--#include terminal
local batch_key = KEYS[1]
local now = ARGV[1]

return batch_settle(batch_key, now)
