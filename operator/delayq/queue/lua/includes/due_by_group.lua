--@include group_in_flight
--@include group_keys
--@include group_offer
--@include group_turn

-- The second pass of a claim (after due_by_priority): up to `room` messages of the slot's
-- groups already due by `now`, served round-robin: the groups whose turn has come (`groups`
-- score <= group_turn(now_micros), the least recently served first, at most `room` of them)
-- each offer up to their share, ceil(room / groups), and at most what their bound
-- `max_in_flight` leaves (0: no bound; group_in_flight), but the ids in `skip` (the priority
-- pass's; group_offer), and the batch takes one of each group in turn; what room is left is
-- shared again among the groups that have more. A group's herd therefore takes no more of a
-- claim than any other group's few, and a claim comes back full while due messages are left
-- that the bounds allow (the consumer reads a short batch as a slot drained).
-- Returns a flat {id, due, ...} like store's ZRANGEBYSCORE WITHSCORES, and the groups looked
-- at (rescore_groups puts each back in the round after the claim): {group, parked}, and
-- whether the slot has groups at all (one EXISTS tells a slot without; none when the caller
-- knows it has none, `absent`).
local function due_by_group(store, prepare, now, now_micros, room, max_in_flight, skip, absent)
  local wait, groups, leases = group_keys(store)
  local taken, visited = {}, {}
  if absent or redis.call('EXISTS', groups) == 0 then return taken, visited, false end
  if room <= 0 then return taken, visited, true end
  local names = redis.call('ZRANGEBYSCORE', groups, '-inf', group_turn(now_micros), 'LIMIT', 0,
    room)
  if #names == 0 then return taken, visited, true end
  -- one of each group's offer in turn, until the batch is full
  local function take_in_turn(offers)
    local round = 1
    while #taken < 2 * room do
      local any = false
      for n = 1, #names do
        local offer = offers[n]
        local k = offer and 2 * round - 1
        if k and offer[k] and #taken < 2 * room then
          taken[#taken + 1] = offer[k]
          taken[#taken + 1] = offer[k + 1]
          any = true
        end
      end
      if not any then return end
      round = round + 1
    end
  end
  local share = math.ceil(room / #names)
  local offers, read, more, left = {}, {}, {}, {}
  for n, group in ipairs(names) do
    left[n] = room
    if max_in_flight > 0 then
      left[n] = max_in_flight - group_in_flight(leases, prepare, group, max_in_flight)
    end
    visited[n] = {group, left[n] <= 0}
    if left[n] > 0 then
      local allowed = math.min(share, left[n])
      offers[n], read[n], more[n] = group_offer(store, wait, group, now, allowed, skip, 0)
      left[n] = left[n] - #offers[n] / 2
    end
  end
  take_in_turn(offers)
  -- what the few left of the batch goes on to the groups that have more, shared again (a herd
  -- of one group fills a batch its few neighbours did not), a few times at most
  for _ = 1, 3 do
    local wanting = {}
    for n = 1, #names do
      if more[n] and left[n] > 0 then wanting[#wanting + 1] = n end
    end
    local rest = room - #taken / 2
    if rest <= 0 or #wanting == 0 then break end
    share = math.ceil(rest / #wanting)
    offers = {}
    for _, n in ipairs(wanting) do
      local offer, total, again = group_offer(store, wait, names[n], now,
        math.min(share, left[n]), skip, read[n])
      offers[n], read[n], more[n] = offer, total, again
      left[n] = left[n] - #offer / 2
    end
    take_in_turn(offers)
  end
  return taken, visited, true
end
