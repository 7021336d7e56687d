#!lua flags=no-writes
--[[
  One page of a slot's dead messages, oldest first (read-only).

  KEYS[1] dead     ZSET id -> time of death ms
  KEYS[2] msg      HASH id -> record
  KEYS[3] reason   HASH id -> dead reason

  ARGV[1] offset  index of the first dead message of the page
  ARGV[2] count   page size

  Returns {total_dead, id1, died_ms1, record1, reason1, id2, ...}

  Events: none
]]
--@include append

local dead, msg, reason = KEYS[1], KEYS[2], KEYS[3]
local offset, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local page = redis.call('ZRANGE', dead, offset, offset + count - 1, 'WITHSCORES')
local results = {redis.call('ZCARD', dead)}
for i = 1, #page, 2 do
  local id = page[i]
  append(results, id, tonumber(page[i + 1]),
    redis.call('HGET', msg, id) or '', redis.call('HGET', reason, id) or '')
end
return results
