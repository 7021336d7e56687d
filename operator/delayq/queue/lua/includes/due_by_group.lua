--@include group_in_flight
--@include group_keys
--@include group_offer
--@include group_turn

-- The second pass of a claim (after due_by_priority): up to `room` messages of the slot's
-- groups already due by `now`, served round-robin: the groups whose turn has come (`groups`
-- score <= group_turn(now_micros), the least recently served first, at most `room` of them)
-- each offer up to their share, ceil(room / groups), and at most what their bound
-- `max_in_flight` leaves (0: no bound; group_in_flight), but the ids in `skip` (the priority
-- pass's; group_offer), and the batch takes one of each group in turn. A group's herd
-- therefore takes no more of a claim than any other group's few.
-- Returns a flat {id, due, ...} like store's ZRANGEBYSCORE WITHSCORES, and the groups looked
-- at (rescore_groups puts each back in the round after the claim): {group, parked}, and
-- whether the slot has groups at all (one EXISTS tells a slot without).
local function due_by_group(store, prepare, now, now_micros, room, max_in_flight, skip)
  local wait, groups, leases = group_keys(store)
  local taken, visited = {}, {}
  if redis.call('EXISTS', groups) == 0 then return taken, visited, false end
  if room <= 0 then return taken, visited, true end
  local names = redis.call('ZRANGEBYSCORE', groups, '-inf', group_turn(now_micros), 'LIMIT', 0,
    room)
  if #names == 0 then return taken, visited, true end
  local share = math.ceil(room / #names)
  local offers = {}
  for n, group in ipairs(names) do
    local allowed = share
    if max_in_flight > 0 then
      allowed = math.min(share, max_in_flight - group_in_flight(leases, prepare, group,
        max_in_flight))
    end
    visited[n] = {group, allowed <= 0}
    if allowed > 0 then
      offers[n] = group_offer(store, wait, group, now, allowed, skip)
    end
  end
  -- one of each group in turn
  local round = 1
  while #taken < 2 * room do
    local any = false
    for n = 1, #names do
      local o = offers[n]
      local k = o and 2 * round - 1
      if k and o[k] and #taken < 2 * room then
        taken[#taken + 1] = o[k]
        taken[#taken + 1] = o[k + 1]
        any = true
      end
    end
    if not any then break end
    round = round + 1
  end
  return taken, visited, true
end
