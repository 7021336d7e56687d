--[[
  Define (create or replace) a recurring schedule in its slot and materialise its first
  occurrence. Python computed the first occurrence after the server's now and its successor;
  replacing a schedule first removes its waiting occurrence (one already claimed is delivered
  and acked as usual: it no longer matches the schedule, so it materialises nothing).

  KEYS[1] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[2] topup    ZSET schedule id -> ms since its top-up is owed
  KEYS[3] store    ZSET id -> due ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] wake     LIST wake-up marker of the slot
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] prepare  ZSET id -> lease deadline ms
  KEYS[8] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[9] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len  0 = journal off (record)
  ARGV[2] schedule id
  ARGV[3] value     the packed schedule, its current field the first occurrence's due ms

  Returns {code, due_ms}
     1 CREATED      a new schedule; due_ms = its first occurrence
     3 UPDATED      the schedule replaced an existing one; due_ms = its first occurrence
    -6 WRONG_STATE  the first occurrence is not after the server's now (or is being delivered):
                    nothing changed; due_ms = server now (compute again from it)

  Events: scheduled (the first occurrence), cancelled (the replaced schedule's waiting one)
]]
--@include codes
--@include journal
--@include materialize
--@include now_ms
--@include occurrence_record
--@include refuse_if_moving
--@include series_fields
--@include topic_settings
--@include wake_if_earliest

refuse_if_moving(KEYS[8])

local schedules, topup, store, msg, wake, journal_key, prepare =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[1]}))
local sid, value = ARGV[2], ARGV[3]
local now = now_ms()
local first = series_fields(value)
if tonumber(first) <= now or redis.call('ZSCORE', prepare, sid .. '@' .. first) then
  return {CODE.WRONG_STATE, now}
end

local old = redis.call('HGET', schedules, sid)
if old then
  local waiting = sid .. '@' .. series_fields(old)
  if redis.call('ZREM', store, waiting) == 1 then
    redis.call('HDEL', msg, waiting)
    redis.call('HDEL', KEYS[9], waiting)
    journal(journal_key, journal_max_len, 'cancelled', waiting, now, '', '')
  end
end
redis.call('HSET', schedules, sid, value)
redis.call('ZREM', topup, sid)
materialize(store, msg, journal_key, journal_max_len, sid, first, occurrence_record(value), now)
wake_if_earliest(store, wake, tonumber(first))
if old then return {CODE.UPDATED, tonumber(first)} end
return {CODE.CREATED, tonumber(first)}
