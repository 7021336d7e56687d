-- Wake the slot's consumer when `due` is (one of) the earliest due times in the store.
-- The wake list holds at most one element, so a burst of schedules costs one push. The range's
-- bounds are strings: Redis 7.0 writes every Lua number given to redis.call with "%.17g", a
-- few hundred ns of printf each, and a producer's batch over many slots asks here once a slot.
local function wake_if_earliest(store, wake, due)
  local head = redis.call('ZRANGE', store, '0', '0', 'WITHSCORES')
  if head[2] ~= nil and tonumber(head[2]) >= due and redis.call('LLEN', wake) == 0 then
    redis.call('RPUSH', wake, '1')
  end
end
