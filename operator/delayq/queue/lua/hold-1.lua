#!lua flags=allow-oom
--[[
  Hold the topic's delivery for a while (queue/pacing.py): a receiver answered 429 or 503 with
  Retry-After. Until the hold ends, pace-1 grants nothing, so no pod of any broker claims; a
  longer hold already set stays. The caller bounds hold_ms (at most 5 minutes, never past the
  topic's expiry.ttl); the script bounds it again by max_ms.

  KEYS[1] pace  HASH tokens, at, until (server ms the hold ends)

  ARGV[1] hold_ms  how long the receiver asked for
  ARGV[2] max_ms   the longest hold allowed

  Returns the server ms the hold ends.

  Runs under maxmemory (allow-oom): one small hash field.

  Events: none
]]
--@include now_ms

local key = KEYS[1]
local hold_ms = math.max(0, math.min(tonumber(ARGV[1]), tonumber(ARGV[2])))
local now = now_ms()
local hold_until = math.max(tonumber(redis.call('HGET', key, 'until')) or 0, now + hold_ms)
redis.call('HSET', key, 'until', hold_until)
if redis.call('PTTL', key) < hold_until - now + 1000 then
  redis.call('PEXPIRE', key, hold_until - now + 1000)
end
return hold_until
