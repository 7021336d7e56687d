-- Remember a finished message for the topic's outcome retention (0: off): the slot's `outcome`
-- hash holds "<state>:<finished ms>:<attempts>" (state 'done' | 'cancelled' | 'purged'), its
-- `finished` zset the same id by finished ms, the order forget_expired trims in.
local function remember(outcome, finished, retention_ms, now, id, state, attempts)
  if retention_ms > 0 then
    redis.call('HSET', outcome, id, state .. ':' .. now .. ':' .. (tonumber(attempts) or 0))
    redis.call('ZADD', finished, now, id)
  end
end
