#!lua flags=allow-oom
--[[
  Acknowledge leased messages (two-phase consumption, commit): the message is done and removed.

  KEYS[1] prepare  ZSET id -> lease deadline ms
  KEYS[2] msg      HASH id -> record
  KEYS[3] epoch    STRING fencing epoch of the slot owner
  KEYS[4] journal  STREAM lifecycle events
  KEYS[5] outcome  HASH id -> remembered outcome of a finished message
  KEYS[6] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[7] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] epoch                 the caller's fencing epoch
  ARGV[2] journal_max_len       0 = journal off (record)
  ARGV[3] outcome_retention_ms  0 = finished messages are not remembered (record)
  ARGV[4 + 2k], ARGV[5 + 2k]    per message: id, lease (the lease number claim wrote in its
                                record)

  Returns, per message:
     7 ACKED       removed for good (remembered as 'done' for the retention)
    -2 STALE_EPOCH the caller is not the current owner: nothing was changed (whole call)
    -3 LEASE_LOST  not leased under that lease any more (acked, cancelled, rescheduled,
                   replaced, given back, or expired and claimed again): nothing was changed
                   for that id

  Runs under maxmemory (allow-oom): an ack frees memory.

  Events: acked
]]
--@include call_chunked
--@include codes
--@include epoch_matches
--@include forget_bases
--@include forget_expired
--@include journal
--@include now_ms
--@include read_chunked
--@include record_fields
--@include remember
--@include topic_settings

local prepare, msg, epoch_key, journal_key, outcome, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len, retention_ms =
  topic_settings(KEYS[1], {'journal_max_len', 'outcome_retention_ms'}, {ARGV[2], ARGV[3]})
journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
local results = {}

if not epoch_matches(epoch_key, ARGV[1]) then
  for i = 4, #ARGV, 2 do results[#results + 1] = CODE.STALE_EPOCH end
  return results
end
local now = now_ms()

local ids = {}
for i = 4, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
local leased = read_chunked('ZMSCORE', prepare, ids)
local records = read_chunked('HMGET', msg, ids)
-- the leases were all read before any is acked: an id given twice in one call is acked once,
-- its repeat answered LEASE_LOST as it would be in a call of its own
local done, acked = {}, {}
for k = 1, #ids do
  local id, record = ids[k], leased[k] and records[k]
  local attempts, due, lease = nil, nil, nil
  if record and not acked[id] then attempts, due, lease = record_fields(record) end
  if lease ~= nil and lease == ARGV[2 * k + 3] then
    done[#done + 1] = id
    acked[id] = true
    journal(journal_key, journal_max_len, 'acked', id, now, due, attempts)
    remember(outcome, finished, retention_ms, now, id, 'done', attempts)
    results[#results + 1] = CODE.ACKED
  else
    results[#results + 1] = CODE.LEASE_LOST
  end
end
if #done > 0 then
  call_chunked('ZREM', prepare, done)
  call_chunked('HDEL', msg, done)
  forget_bases(KEYS[7], retention_ms, done)
end
forget_expired(outcome, finished, KEYS[7], msg, retention_ms, now, #done)
return results
