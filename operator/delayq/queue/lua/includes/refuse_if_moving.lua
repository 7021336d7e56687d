--@include moving_refusal

-- A write into a slot that is being moved to another broker is refused (moving_refusal), so
-- nothing lands on the broker the slot is leaving. A read by id (get-7) is refused too: the
-- source is emptied once the move is done.
local function refuse_if_moving(epoch_key)
  local refusal = moving_refusal(epoch_key, redis.call('GET', epoch_key))
  if refusal then error({err = refusal}) end
end
