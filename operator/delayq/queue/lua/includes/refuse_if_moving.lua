-- A write into a slot that is being moved to another broker is refused, so nothing lands on the
-- broker the slot is leaving: from the freeze to the end of the move its epoch reads
-- 'moving:<epoch>' (queue/migration.py), and stays so on the source as a tombstone after it.
-- A read by id (get-7) is refused too: the source is emptied once the move is done. The error
-- reply starts with SLOT_MOVING, which the clients raise as SlotMovingError: retry against the
-- slot's new routing.
local function refuse_if_moving(epoch_key)
  local epoch = redis.call('GET', epoch_key)
  if epoch and string.sub(epoch, 1, 7) == 'moving:' then
    error({err = 'SLOT_MOVING ' .. epoch_key .. ' is moving to another broker; retry'})
  end
end
