--@include group_keys
--@include group_range
--@include group_turn

-- After a claim: each group due_by_group looked at takes its place in the round again, at its
-- next message's due or, when that is already due, at this claim's instant (group_turn:
-- behind every group not served since, so when more groups are due than a claim takes, the
-- claims serve them round-robin),
-- '+inf' while at its in-flight bound (end_group_lease brings it back), or leaves the round
-- when it has no message waiting.
local function rescore_groups(store, visited, now_micros)
  if #visited == 0 then return end
  local wait, groups = group_keys(store)
  for _, seen in ipairs(visited) do
    local group, parked = seen[1], seen[2]
    local low, high = group_range(group)
    local head = redis.call('ZRANGEBYLEX', wait, low, high, 'LIMIT', 0, 1)[1]
    if not head then
      redis.call('ZREM', groups, group)
    elseif parked then
      redis.call('ZADD', groups, '+inf', group)
    else
      local due = tonumber(string.match(head, '%z(%d+)%z', #group + 1))
      local turn = group_turn(now_micros)
      if due > now_micros / 1000 then turn = string.format('%d', due) end
      redis.call('ZADD', groups, turn, group)
    end
  end
end
