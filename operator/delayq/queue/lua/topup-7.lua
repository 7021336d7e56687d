--[[
  Top up recurring schedules: store each one's precomputed next occurrence (Python computed it
  from what schedules-4 read), compare-and-set on what was read, so a top-up computed from a
  stale read changes nothing and a repeated one is a no-op. Not fenced: any process may run it,
  and running it twice is harmless.

  When the current occurrence no longer waits unclaimed in the store (it was claimed while the
  top-up was owed, skipped, or is a retry), the next occurrence is materialised here instead and the schedule still
  owes a top-up (ADVANCED): the caller reads it again and tops it up from there.

  KEYS[1] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[2] topup    ZSET schedule id -> ms since its top-up is owed
  KEYS[3] store    ZSET id -> due ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] wake     LIST wake-up marker of the slot
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len  0 = journal off (record)
  ARGV[2 + 4k .. 5 + 4k]  per schedule: id, current due ms as read, waiting (unclaimed) as read
                          ('1' | '0'),
                          the following due ms or 'end'

  Returns a flat array, per schedule the pair code, due_ms:
    15 TOPPED_UP    the next occurrence is stored (or already was)    due_ms = current
    16 ADVANCED     the following occurrence was materialised         due_ms = its due
    -6 WRONG_STATE  the schedule changed since it was read: nothing   due_ms = current
    -1 NOT_FOUND    no such schedule (deleted): dropped from topup    due_ms = 0

  Events: scheduled (a materialised occurrence)
]]
--@include append
--@include codes
--@include materialize
--@include now_ms
--@include occurrence_record
--@include refuse_if_moving
--@include series_fields
--@include series_with
--@include topic_settings
--@include unclaimed
--@include wake_if_earliest

refuse_if_moving(KEYS[7])

local schedules, topup, store, msg, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[1]}))
local now = now_ms()
local results = {}
for i = 2, #ARGV, 4 do
  local sid, expected, expected_waiting, following = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local value = redis.call('HGET', schedules, sid)
  if not value then
    redis.call('ZREM', topup, sid)
    append(results, CODE.NOT_FOUND, 0)
  else
    local current, nxt = series_fields(value)
    local waiting = unclaimed(store, msg, sid .. '@' .. current) and '1' or '0'
    if current ~= expected or waiting ~= expected_waiting then
      append(results, CODE.WRONG_STATE, tonumber(current))
    elseif nxt ~= '' or waiting == '1' or following == 'end' then
      if nxt == '' then redis.call('HSET', schedules, sid, series_with(value, current, following)) end
      redis.call('ZREM', topup, sid)
      append(results, CODE.TOPPED_UP, tonumber(current))
    else
      local record = occurrence_record(value)
      materialize(store, msg, journal_key, journal_max_len, sid, following, record, now)
      wake_if_earliest(store, wake, tonumber(following))
      redis.call('HSET', schedules, sid, series_with(value, following, ''))
      append(results, CODE.ADVANCED, tonumber(following))
    end
  end
end
return results
