--@include group_range
--@include read_chunked

-- The in-flight count of `group` in the slot (its entries in `leases`); at the bound
-- `max_in_flight` its entries are checked against `prepare` first, and one whose lease ended
-- on a path that missed it is dropped, so no count can stay above the leases it counts.
local function group_in_flight(leases, prepare, group, max_in_flight)
  local low, high = group_range(group)
  local count = redis.call('ZLEXCOUNT', leases, low, high)
  if count < max_in_flight then return count end
  local entries = redis.call('ZRANGEBYLEX', leases, low, high)
  local ids = {}
  for k, entry in ipairs(entries) do ids[k] = string.sub(entry, #group + 2) end
  local deadlines = read_chunked('ZMSCORE', prepare, ids)
  for k, entry in ipairs(entries) do
    if not deadlines[k] then
      redis.call('ZREM', leases, entry)
      count = count - 1
    end
  end
  return count
end
