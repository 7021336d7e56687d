-- Forget remembered outcomes older than the retention, the oldest first: a call that finished
-- n messages forgets at most n + 64 (and at most 1000, Lua's unpack stays small). Trimming
-- rides on the calls that remember, so it keeps pace with them, no call pays for a large
-- backlog and no sweep ever walks the set; the slot basis entries of the forgotten ids go with
-- them (forget_bases); an expired entry not trimmed yet is ignored by
-- `remembered`, and one left by a retention turned off drains on the slot's next finishes.
local function forget_expired(outcome, finished, basis, retention_ms, now, finished_count)
  local budget = math.min(finished_count + 64, 1000)
  -- inclusive: `remembered` forgets an outcome at exactly now - retention_ms too
  local old = redis.call('ZRANGE', finished, '-inf', now - retention_ms, 'BYSCORE',
    'LIMIT', 0, budget)
  if #old > 0 then
    redis.call('ZREM', finished, unpack(old))
    redis.call('HDEL', outcome, unpack(old))
    redis.call('HDEL', basis, unpack(old))
  end
end
