#!lua flags=no-writes
--[[
  Depth and timing of one slot or of several slots of one broker (read-only): the consumer's
  watchdog reads every slot it owns on a broker in one call a second, not one call per slot
  (at 1,024 slots that was ~1,000 calls a second on an idle topic). One slot's reply is what it
  always was.

  KEYS[1] store    ZSET id -> due ms            (then again per further slot: KEYS[3k + 1])
  KEYS[2] prepare  ZSET id -> lease deadline ms (KEYS[3k + 2])
  KEYS[3] dead     ZSET id -> time of death ms  (KEYS[3k + 3])

  ARGV: none

  Returns {now_ms, then per slot: scheduled, due, prepared, dead, next_due_ms,
  next_deadline_ms}: `scheduled` counts all of store, `due` those already due and not yet
  claimed; next_* are -1 when empty. All slots are read at the same `now_ms`.

  Events: none
]]
--@include now_ms

local now = now_ms()
local out = {now}
for i = 1, #KEYS, 3 do
  local store, prepare = KEYS[i], KEYS[i + 1]
  local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
  local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
  local next_due = head[2] and tonumber(head[2])
  local next_deadline = lease_head[2] and tonumber(lease_head[2])
  -- an empty set or a head not due yet answers its count without asking (most slots idle)
  out[#out + 1] = next_due and redis.call('ZCARD', store) or 0
  out[#out + 1] = next_due and next_due <= now and redis.call('ZCOUNT', store, '-inf', now) or 0
  out[#out + 1] = next_deadline and redis.call('ZCARD', prepare) or 0
  out[#out + 1] = redis.call('ZCARD', KEYS[i + 2])
  out[#out + 1] = next_due or -1
  out[#out + 1] = next_deadline or -1
end
return out
