--@include record_fields

-- The record of a leased message, when `lease` (the token's lease number, a string) is the
-- lease it holds now; false otherwise (acked, rolled back, given back, rescheduled, replaced).
local function leased_record(prepare, msg, id, lease)
  local record = redis.call('ZSCORE', prepare, id) and redis.call('HGET', msg, id)
  if record and select(3, record_fields(record)) == lease then return record end
  return false
end
