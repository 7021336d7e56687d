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
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
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
--@include ack_slot
--@include now_ms

local results = {}
ack_slot(KEYS, 0, {ARGV[2], ARGV[3]}, ARGV[1], ARGV, 4, #ARGV, now_ms(), nil, results)
return results
