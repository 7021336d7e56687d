#!lua flags=allow-oom
--[[
  Cancel messages by id, whatever their state (a leased message's later ack then fails).

  Cancelling the occurrence a recurring schedule waits for (its current one, never claimed)
  skips just that occurrence: the schedule then owes a top-up, which materialises the next one,
  and the slot's wake list makes its owner claim, see the top-up owed and run it.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] outcome  HASH id -> remembered outcome of a finished message
  KEYS[8] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[9] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[10] topup   ZSET schedule id -> ms since its top-up is owed
  KEYS[11] wake    LIST wake-up marker of the slot
  KEYS[12] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[13] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len       0 = journal off (record)
  ARGV[2] outcome_retention_ms  0 = finished messages are not remembered (record)
  ARGV[3..] ids

  Returns, per id: 4 CANCELLED (remembered as 'cancelled' for the retention) | -1 NOT_FOUND

  Runs under maxmemory (allow-oom): a cancel frees memory (the outcome it may remember is a few bytes).

  Events: cancelled
]]
--@include codes
--@include end_group_lease
--@include forget_bases
--@include forget_expired
--@include journal
--@include locate
--@include now_ms
--@include priority_key
--@include record_fields
--@include refuse_if_moving
--@include remember
--@include series_fields
--@include series_with
--@include topic_settings
--@include unclaimed
--@include wake_at

refuse_if_moving(KEYS[12])

local store, prepare, dead, msg, reason, journal_key, outcome, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local schedules, topup, wake, basis = KEYS[9], KEYS[10], KEYS[11], KEYS[13]
local journal_max_len, retention_ms =
  topic_settings(KEYS[1], {'journal_max_len', 'outcome_retention_ms'}, {ARGV[1], ARGV[2]})
journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
local now = now_ms()
local results = {}
local cancelled = 0
local has_series = redis.call('HLEN', schedules) > 0
local owes_top_up = false

-- Before `id` is cancelled: when it is the occurrence its schedule waits for, the schedule
-- owes a top-up (its precomputed next is cleared, so the top-up materialises the next one).
local function release_series(id)
  local sid, due = string.match(id, '^(.+)@(%d+)$')
  local value = sid and redis.call('HGET', schedules, sid)
  if not value or series_fields(value) ~= due or not unclaimed(store, msg, id) then return end
  redis.call('HSET', schedules, sid, series_with(value, due, ''))
  redis.call('ZADD', topup, now, sid)
  owes_top_up = true
end

for i = 3, #ARGV do
  local id = ARGV[i]
  local state = locate(store, prepare, dead, id)
  if state then
    if has_series then release_series(id) end
    local record = redis.call('HGET', msg, id)
    if record and state == 'prepared' then
      end_group_lease(store, id, record, select(4, record_fields(record)), now)
    end
    redis.call('ZREM', store, id)
    redis.call('ZREM', priority_key(store), id)
    redis.call('ZREM', prepare, id)
    redis.call('ZREM', dead, id)
    redis.call('HDEL', reason, id)
    redis.call('HDEL', msg, id)
    journal(journal_key, journal_max_len, 'cancelled', id, now, '', '')
    remember(outcome, finished, retention_ms, now, id, 'cancelled',
      record and record_fields(record) or 0)
    forget_bases(basis, retention_ms, {id})
    cancelled = cancelled + 1
    results[#results + 1] = CODE.CANCELLED
  else
    results[#results + 1] = CODE.NOT_FOUND
  end
end
forget_expired(outcome, finished, basis, msg, retention_ms, now, cancelled)
if owes_top_up then wake_at(wake, '1') end
return results
