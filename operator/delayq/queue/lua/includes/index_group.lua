--@include group_keys
--@include group_member

-- A message of `group` (nil: none, which costs nothing) put into store at `due` joins its
-- group's waiting messages, and the group the round of the claims (includes/due_by_group.lua):
-- ZADD LT, so an earlier message brings its group's turn forward, never back; a group at its
-- in-flight bound (+inf) comes back and is parked again by the claim if it still is.
local function index_group(key, id, group, due)
  if not group then return end
  local wait, groups = group_keys(key)
  redis.call('ZADD', wait, 0, group_member(group, due, id))
  redis.call('ZADD', groups, 'LT', string.format('%d', due), group)
end
