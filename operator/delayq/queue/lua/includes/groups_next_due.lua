--@include group_keys

-- The next due of a slot with groups whose claim came back short (claim_slot): the earlier of
-- the first group's turn (none while every group is at its in-flight bound, +inf) and the
-- first message of store not due by `now`; -1 when there is neither.
local function groups_next_due(store, now)
  local _, groups = group_keys(store)
  local next_due = -1
  local turn = tonumber(redis.call('ZRANGE', groups, 0, 0, 'WITHSCORES')[2])
  if turn and turn ~= math.huge then next_due = math.max(math.ceil(turn), now + 1) end
  local later = redis.call('ZRANGEBYSCORE', store, '(' .. string.format('%d', now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)[2]
  if later and (next_due < 0 or tonumber(later) < next_due) then next_due = tonumber(later) end
  return next_due
end
