-- The fencing check: only the slot's current owner (epoch set by fence-10) may move its messages.
-- `current` is the key's value when the caller read it already (claimmany-1 reads all its
-- slots' epochs at once; false when unset), else nil: read here.
local function epoch_matches(epoch_key, epoch, current)
  if current == nil then current = redis.call('GET', epoch_key) end
  return current ~= false and current == epoch
end
