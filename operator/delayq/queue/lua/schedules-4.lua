#!lua flags=no-writes
--[[
  Read recurring schedules of one slot (read-only): given ids, those owing a top-up, or all.

  KEYS[1] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[2] topup    ZSET schedule id -> ms since its top-up is owed
  KEYS[3] store    ZSET id -> due ms
  KEYS[4] msg      HASH id -> record

  ARGV[1] mode     'ids' | 'owed' (at most ARGV[2] of those owing a top-up, oldest first) | 'all'
  ARGV[2] max_count  for 'owed'
  ARGV[3..]        schedule ids, for 'ids'

  Returns {now_ms, id1, value1, waiting1, ...}: now_ms is the server clock; value is the packed
  schedule ('' when there is no such schedule); waiting is 1 when its current occurrence waits
  in the store, never claimed (0 once claimed, even when it waits again for a retry). No return
  codes.

  Events: none (read-only)
]]
--@include append
--@include now_ms
--@include series_fields
--@include unclaimed

local schedules, topup, store, msg = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode = ARGV[1]
local reply = {now_ms()}
local ids, values = {}, {}
if mode == 'all' then
  local flat = redis.call('HGETALL', schedules)
  for i = 1, #flat, 2 do
    ids[#ids + 1] = flat[i]
    values[#values + 1] = flat[i + 1]
  end
else
  if mode == 'owed' then
    ids = redis.call('ZRANGE', topup, 0, tonumber(ARGV[2]) - 1)
  else
    for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
  end
  if #ids > 0 then values = redis.call('HMGET', schedules, unpack(ids)) end
end
for k = 1, #ids do
  local value, waiting = values[k], 0
  if value then
    if unclaimed(store, msg, ids[k] .. '@' .. series_fields(value)) then waiting = 1 end
  else
    value = ''
  end
  append(reply, ids[k], value, waiting)
end
return reply
