--@include record_fields

-- True when message `id` waits in the store and was never claimed (0 attempts): the state in
-- which a schedule's current occurrence will, when claimed, materialise the next one. A retry
-- (nacked or expired back to the store) has been claimed already.
local function unclaimed(store, msg, id)
  if not redis.call('ZSCORE', store, id) then return false end
  local record = redis.call('HGET', msg, id)
  return record ~= false and record_fields(record) == 0
end
