--[[
  Cancel messages by id, whatever their state (a leased message's later ack then fails).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] journal  STREAM lifecycle events

  ARGV[1] journal_max_len  0 = journal off
  ARGV[2..] ids

  Returns, per id: 4 CANCELLED | -1 NOT_FOUND

  Events: cancelled
]]
--@include codes
--@include journal
--@include locate
--@include now_ms

local store, prepare, dead, msg, reason, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len = tonumber(ARGV[1])
local now = now_ms()
local results = {}

for i = 2, #ARGV do
  local id = ARGV[i]
  local state = locate(store, prepare, dead, id)
  if state then
    redis.call('ZREM', store, id)
    redis.call('ZREM', prepare, id)
    redis.call('ZREM', dead, id)
    redis.call('HDEL', reason, id)
    redis.call('HDEL', msg, id)
    journal(journal_key, journal_max_len, 'cancelled', id, now, '', '')
    results[#results + 1] = CODE.CANCELLED
  else
    results[#results + 1] = CODE.NOT_FOUND
  end
end
return results
