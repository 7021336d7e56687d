-- The refusal of a write into a slot that is being moved to another broker, or nil when it is
-- not: from the freeze to the end of the move its epoch reads 'moving:<epoch>' (coordination/
-- migration.py), and stays so on the source as a tombstone after it. The text starts with
-- SLOT_MOVING, which the clients raise as SlotMovingError: retry against the slot's new
-- routing. refuse_if_moving raises it; a call of several slots answers it per message of that
-- slot (schedulemany-1, which reads all its slots' epochs at once) and goes on with the
-- others. `epoch` is the value of `epoch_key` (false when unset).
local function moving_refusal(epoch_key, epoch)
  if epoch and string.sub(epoch, 1, 7) == 'moving:' then
    return 'SLOT_MOVING ' .. epoch_key .. ' is moving to another broker; retry'
  end
  return nil
end
