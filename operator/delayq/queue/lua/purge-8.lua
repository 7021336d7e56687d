#!lua flags=allow-oom
--[[
  Purge dead messages for good.

  KEYS[1] dead     ZSET id -> time of death ms
  KEYS[2] msg      HASH id -> record
  KEYS[3] reason   HASH id -> dead reason
  KEYS[4] journal  STREAM lifecycle events
  KEYS[5] outcome  HASH id -> remembered outcome of a finished message
  KEYS[6] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[7] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[8] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] journal_max_len       0 = journal off (record)
  ARGV[2] outcome_retention_ms  0 = finished messages are not remembered (record)
  ARGV[3] mode                  'ids' (the ids that follow) | 'oldest' (up to max_count oldest)
  ARGV[4] max_count             with mode 'oldest': how many at most
  ARGV[5..] ids                 with mode 'ids'

  Returns {remaining_dead, id1, code1, id2, code2, ...}, codes:
    12 PURGED       gone (remembered as 'purged' for the retention)
    -6 WRONG_STATE  with mode 'ids': the id is not dead

  Runs under maxmemory (allow-oom): a purge frees memory.

  Events: purged
]]
--@include append
--@include codes
--@include dead_batch_ids
--@include forget_bases
--@include forget_expired
--@include journal
--@include now_ms
--@include record_fields
--@include refuse_if_moving
--@include remember
--@include topic_settings

refuse_if_moving(KEYS[7])

local dead, msg, reason, journal_key, outcome, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len, retention_ms =
  topic_settings(KEYS[1], {'journal_max_len', 'outcome_retention_ms'}, {ARGV[1], ARGV[2]})
journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
local now = now_ms()

local ids = dead_batch_ids(dead, ARGV[3], ARGV[4], ARGV, 5)

local results = {0}
local purged = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead, id) == 1 then
    local record = redis.call('HGET', msg, id)
    remember(outcome, finished, retention_ms, now, id, 'purged',
      record and record_fields(record) or 0)
    forget_bases(KEYS[8], retention_ms, {id})
    purged = purged + 1
    redis.call('HDEL', msg, id)
    redis.call('HDEL', reason, id)
    journal(journal_key, journal_max_len, 'purged', id, now, '', '')
    append(results, id, CODE.PURGED)
  else
    append(results, id, CODE.WRONG_STATE)
  end
end
forget_expired(outcome, finished, KEYS[8], msg, retention_ms, now, purged)
results[1] = redis.call('ZCARD', dead)
return results
