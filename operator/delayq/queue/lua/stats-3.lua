#!lua flags=no-writes
--[[
  Depth and timing of one slot (read-only).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms

  ARGV: none

  Returns {now_ms, scheduled, due, prepared, dead, next_due_ms, next_deadline_ms}: `scheduled`
  counts all of store, `due` those already due and not yet claimed; next_* are -1 when empty.

  Events: none
]]
--@include now_ms

local store, prepare, dead = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
return {
  now,
  redis.call('ZCARD', store),
  redis.call('ZCOUNT', store, '-inf', now),
  redis.call('ZCARD', prepare),
  redis.call('ZCARD', dead),
  head[2] and tonumber(head[2]) or -1,
  lease_head[2] and tonumber(lease_head[2]) or -1,
}
