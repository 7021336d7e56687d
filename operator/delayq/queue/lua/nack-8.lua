#!lua flags=allow-oom
--[[
  Negatively acknowledge leased messages (two-phase consumption, roll back): the message waits
  again for exactly delay_ms after server now, or goes to dead when its attempts are exhausted
  or the caller says it can never succeed (a poison message must not block its slot).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] epoch    STRING fencing epoch of the slot owner
  KEYS[7] wake     LIST wake-up marker of the slot
  KEYS[8] journal  STREAM lifecycle events

  ARGV[1] epoch           the caller's fencing epoch
  ARGV[2] max_retries     attempts beyond this are dead
  ARGV[3] journal_max_len  0 = journal off
  ARGV[4 + 5k .. 8 + 5k]  per message: id, lease, delay_ms, reason, dead ('1' = dead now)

  Returns, flat, per message: code, due_ms
     8 RETRY_SCHEDULED  waits in store until due_ms
     9 DEAD             moved to dead at due_ms (= now)
    -2 STALE_EPOCH      the caller is not the current owner: nothing was changed (whole call)
    -3 LEASE_LOST       not leased under that lease any more: nothing was changed for that id

  Runs under maxmemory (allow-oom): a retry moves the message back to store (a few bytes at
  most), and a full Redis must keep failing deliveries into their retries.

  Events: nacked (due = the retry's due time; the delivered due when it dies), dead
]]
--@include append
--@include codes
--@include epoch_matches
--@include journal
--@include leased_record
--@include now_ms
--@include record_fields
--@include record_with
--@include wake_if_earliest

local store, prepare, dead, msg, reason, epoch_key, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local max_retries = tonumber(ARGV[2])
local journal_max_len = tonumber(ARGV[3])
local results = {}

if not epoch_matches(epoch_key, ARGV[1]) then
  for i = 4, #ARGV, 5 do append(results, CODE.STALE_EPOCH, 0) end
  return results
end
local now = now_ms()
local earliest = nil

for i = 4, #ARGV, 5 do
  local id, delay_ms = ARGV[i], tonumber(ARGV[i + 2])
  local why, dead_now = ARGV[i + 3], ARGV[i + 4] == '1'
  local record = leased_record(prepare, msg, id, ARGV[i + 1])
  if not record then
    append(results, CODE.LEASE_LOST, 0)
  else
    local attempts, due = record_fields(record)
    redis.call('ZREM', prepare, id)
    if dead_now or attempts > max_retries then
      journal(journal_key, journal_max_len, 'nacked', id, now, due, attempts)
      redis.call('ZADD', dead, now, id)
      redis.call('HSET', reason, id, why)
      journal(journal_key, journal_max_len, 'dead', id, now, due, attempts)
      append(results, CODE.DEAD, now)
    else
      local retry_due = now + delay_ms
      redis.call('HSET', msg, id, record_with(record, attempts, '', ''))
      redis.call('ZADD', store, retry_due, id)
      journal(journal_key, journal_max_len, 'nacked', id, now, retry_due, attempts)
      if earliest == nil or retry_due < earliest then earliest = retry_due end
      append(results, CODE.RETRY_SCHEDULED, retry_due)
    end
  end
end

if earliest then wake_if_earliest(store, wake, earliest) end
return results
