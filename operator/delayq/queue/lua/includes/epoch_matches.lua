-- The fencing check: only the slot's current owner (epoch set by fence-10) may move its messages.
local function epoch_matches(epoch_key, epoch)
  local current = redis.call('GET', epoch_key)
  return current ~= false and current == epoch
end
