-- Forget remembered outcomes older than the retention, the oldest first: a call that finished
-- n messages forgets at most n + 64 (and at most 1000, Lua's unpack stays small). Trimming
-- rides on the calls that remember, so it keeps pace with them, no call pays for a large
-- backlog and no sweep ever walks the set; an expired entry not trimmed yet is ignored by
-- `remembered`, and one left by a retention turned off drains on the slot's next finishes.
-- The slot basis entries kept with the outcomes (forget_bases) go with them, but not that of
-- an id with a record in `msg`: scheduled again since, its entry is the new message's.
local function forget_expired(outcome, finished, basis, msg, retention_ms, now, finished_count)
  local budget = math.min(finished_count + 64, 1000)
  -- inclusive: `remembered` forgets an outcome at exactly now - retention_ms too
  local old = redis.call('ZRANGE', finished, '-inf', now - retention_ms, 'BYSCORE',
    'LIMIT', 0, budget)
  if #old > 0 then
    redis.call('ZREM', finished, unpack(old))
    redis.call('HDEL', outcome, unpack(old))
    if redis.call('HLEN', basis) > 0 then
      local records, gone = redis.call('HMGET', msg, unpack(old)), {}
      for k = 1, #old do
        if not records[k] then gone[#gone + 1] = old[k] end
      end
      if #gone > 0 then redis.call('HDEL', basis, unpack(gone)) end
    end
  end
end
