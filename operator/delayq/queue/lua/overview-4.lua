#!lua flags=no-writes
--[[
  The depths and timing of many slots at once, for the service's overview page (read-only):
  16,384 slots are 256 calls of 64, not 16,384. Runs on a full broker (no-writes).

  KEYS[1] store    ZSET id -> due ms            (then again per further slot: KEYS[4k + 1])
  KEYS[2] prepare  ZSET id -> lease deadline ms (KEYS[4k + 2])
  KEYS[3] dead     ZSET id -> time of death ms  (KEYS[4k + 3])
  KEYS[4] epoch    STRING fencing epoch         (KEYS[4k + 4])

  ARGV[1..]  the due windows' lengths in ms, in order

  Returns {now_ms, then per slot: epoch or -1, scheduled, overdue, due in each window, later,
  prepared, dead, next due ms or -1}. In a slot whose due times are in buckets, `overdue` and
  each window are estimated once more than 32 buckets may hold entries in it
  (lua/includes/store_buckets.lua, `estimated_count`: a sample of 32 buckets), so a refresh
  costs the same at any depth; `scheduled` is exact.

  Events: none
]]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i = 1, #KEYS, 4 do
  local store = KEYS[i]
  local total = redis.call('ZCARD', store)
  local overdue = redis.estimated_count(store, '-inf', now)
  out[#out + 1] = tonumber(redis.call('GET', KEYS[i + 3])) or -1
  out[#out + 1] = total
  out[#out + 1] = overdue
  local counted, from = overdue, now
  for w = 1, #ARGV do
    local to = from + tonumber(ARGV[w])
    local count = redis.estimated_count(store, '(' .. from, to)
    out[#out + 1] = count
    counted, from = counted + count, to
  end
  out[#out + 1] = total - counted
  out[#out + 1] = redis.call('ZCARD', KEYS[i + 1])
  out[#out + 1] = redis.call('ZCARD', KEYS[i + 2])
  local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
  out[#out + 1] = head[2] and tonumber(head[2]) or -1
end
return out
