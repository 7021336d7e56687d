--[[
  Cancel messages by id, whatever their state (a leased message's later ack then fails).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] outcome  HASH id -> remembered outcome of a finished message
  KEYS[8] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)

  ARGV[1] journal_max_len       0 = journal off
  ARGV[2] outcome_retention_ms  0 = finished messages are not remembered
  ARGV[3..] ids

  Returns, per id: 4 CANCELLED (remembered as 'cancelled' for the retention) | -1 NOT_FOUND

  Events: cancelled
]]
--@include codes
--@include forget_expired
--@include journal
--@include locate
--@include now_ms
--@include record_fields
--@include remember

local store, prepare, dead, msg, reason, journal_key, outcome, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local journal_max_len, retention_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local results = {}
local cancelled = 0

for i = 3, #ARGV do
  local id = ARGV[i]
  local state = locate(store, prepare, dead, id)
  if state then
    local record = redis.call('HGET', msg, id)
    redis.call('ZREM', store, id)
    redis.call('ZREM', prepare, id)
    redis.call('ZREM', dead, id)
    redis.call('HDEL', reason, id)
    redis.call('HDEL', msg, id)
    journal(journal_key, journal_max_len, 'cancelled', id, now, '', '')
    remember(outcome, finished, retention_ms, now, id, 'cancelled',
      record and record_fields(record) or 0)
    cancelled = cancelled + 1
    results[#results + 1] = CODE.CANCELLED
  else
    results[#results + 1] = CODE.NOT_FOUND
  end
end
forget_expired(outcome, finished, retention_ms, now, cancelled)
return results
