--@include record_fields

-- The record of a leased message and its lease deadline (ms), when `lease` (the token's lease
-- number, a string) is the lease it holds now; false otherwise (acked, rolled back, given back,
-- rescheduled, replaced).
local function leased_record(prepare, msg, id, lease)
  local deadline = redis.call('ZSCORE', prepare, id)
  local record = deadline and redis.call('HGET', msg, id)
  if record and select(3, record_fields(record)) == lease then return record, tonumber(deadline) end
  return false
end
