--[[
  Purge dead messages for good.

  KEYS[1] dead     ZSET id -> time of death ms
  KEYS[2] msg      HASH id -> record
  KEYS[3] reason   HASH id -> dead reason
  KEYS[4] journal  STREAM lifecycle events

  ARGV[1] journal_max_len  0 = journal off
  ARGV[2] mode            'ids' (the ids that follow) | 'oldest' (up to max_count oldest dead)
  ARGV[3] max_count       with mode 'oldest': how many at most
  ARGV[4..] ids           with mode 'ids'

  Returns {remaining_dead, id1, code1, id2, code2, ...}, codes:
    12 PURGED       gone
    -6 WRONG_STATE  with mode 'ids': the id is not dead

  Events: purged
]]
--@include append
--@include codes
--@include dead_batch_ids
--@include journal
--@include now_ms

local dead, msg, reason, journal_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local journal_max_len = tonumber(ARGV[1])
local now = now_ms()

local ids = dead_batch_ids(dead, ARGV[2], ARGV[3], ARGV, 4)

local results = {0}
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead, id) == 1 then
    redis.call('HDEL', msg, id)
    redis.call('HDEL', reason, id)
    journal(journal_key, journal_max_len, 'purged', id, now, '', '')
    append(results, id, CODE.PURGED)
  else
    append(results, id, CODE.WRONG_STATE)
  end
end
results[1] = redis.call('ZCARD', dead)
return results
