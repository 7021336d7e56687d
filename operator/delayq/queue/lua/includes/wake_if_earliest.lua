--@include integer_text
--@include wake_at

-- Wake the slot's consumer when `due` is (one of) the earliest due times in the store,
-- telling it that due (wake_at): it claims then, not now. The range's bounds are strings:
-- Redis 7.0 writes every Lua number given to redis.call with "%.17g", a few hundred ns of
-- printf each, and a producer's batch over many slots asks here once a slot.
local function wake_if_earliest(store, wake, due)
  local head = redis.call('ZRANGE', store, '0', '0', 'WITHSCORES')
  if head[2] ~= nil and tonumber(head[2]) >= due then wake_at(wake, integer_text(due)) end
end
