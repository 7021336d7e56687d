#!lua flags=allow-oom
--[[
  Redrive dead messages: back to store, due now, attempts reset, and without an expiry or a
  retry window (a fresh start: record_extras).

  KEYS[1] dead     ZSET id -> time of death ms
  KEYS[2] store    ZSET id -> due ms
  KEYS[3] msg      HASH id -> record
  KEYS[4] reason   HASH id -> dead reason
  KEYS[5] wake     LIST wake-up marker of the slot
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len  0 = journal off (record)
  ARGV[2] mode            'ids' (the ids that follow) | 'oldest' (up to max_count oldest dead)
  ARGV[3] max_count       with mode 'oldest': how many at most
  ARGV[4..] ids           with mode 'ids'

  Returns {remaining_dead, id1, code1, id2, code2, ...}, codes:
    11 REDRIVEN     waits in store, due now
    -6 WRONG_STATE  with mode 'ids': the id is not dead

  Runs under maxmemory (allow-oom): it moves dead messages back to store, no larger.

  Events: redriven
]]
--@include append
--@include codes
--@include dead_batch_ids
--@include index_group
--@include index_priority
--@include journal
--@include now_ms
--@include record_fields
--@include record_group
--@include record_priority
--@include record_with
--@include refuse_if_moving
--@include topic_settings
--@include wake_if_earliest
--@include without_extras

refuse_if_moving(KEYS[7])

local dead, store, msg, reason, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[1]}))
local now = now_ms()

local ids = dead_batch_ids(dead, ARGV[2], ARGV[3], ARGV, 4)

local results = {0}
local moved = 0
for _, id in ipairs(ids) do
  local record = redis.call('ZSCORE', dead, id) and redis.call('HGET', msg, id)
  if record then
    redis.call('ZREM', dead, id)
    redis.call('HDEL', reason, id)
    redis.call('HSET', msg, id, without_extras(record_with(record, 0, '', '')))
    redis.call('ZADD', store, now, id)
    index_priority(store, id, record_priority(record), now)
    index_group(store, id, record_group(record, select(4, record_fields(record))), now)
    journal(journal_key, journal_max_len, 'redriven', id, now, now, 0)
    moved = moved + 1
    append(results, id, CODE.REDRIVEN)
  else
    append(results, id, CODE.WRONG_STATE)
  end
end
if moved > 0 then wake_if_earliest(store, wake, now) end
results[1] = redis.call('ZCARD', dead)
return results
