#!lua flags=allow-oom
--[[
  Delete a recurring schedule and its waiting occurrence. An occurrence already claimed is
  delivered and acked as usual; it no longer has a schedule, so it materialises nothing.

  KEYS[1] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[2] topup    ZSET schedule id -> ms since its top-up is owed
  KEYS[3] store    ZSET id -> due ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] journal  STREAM lifecycle events
  KEYS[6] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[7] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len  0 = journal off (record)
  ARGV[2] schedule id

  Returns {code}
     4 CANCELLED   the schedule is gone, with its waiting occurrence
    -1 NOT_FOUND   no such schedule in this slot

  Runs under maxmemory (allow-oom): dropping a schedule frees memory.

  Events: cancelled (the waiting occurrence)
]]
--@include codes
--@include journal
--@include now_ms
--@include refuse_if_moving
--@include series_fields
--@include topic_settings

refuse_if_moving(KEYS[6])

local schedules, topup, store, msg, journal_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[1]}))
local sid = ARGV[2]
local value = redis.call('HGET', schedules, sid)
if not value then return {CODE.NOT_FOUND} end
local waiting = sid .. '@' .. series_fields(value)
if redis.call('ZREM', store, waiting) == 1 then
  redis.call('HDEL', msg, waiting)
  redis.call('HDEL', KEYS[7], waiting)
  journal(journal_key, journal_max_len, 'cancelled', waiting, now_ms(), '', '')
end
redis.call('HDEL', schedules, sid)
redis.call('ZREM', topup, sid)
return {CODE.CANCELLED}
