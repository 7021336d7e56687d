#!lua flags=allow-oom
--[[
  Claim due messages of one slot (two-phase consumption, phase one): store -> prepare with a lease.
  First rolls expired leases back (each expiry counts as a failed attempt, retried the
  caller's retry backoff after its lease deadline, as a nack is after the nack; past max_retries or the retry window the message is
  given up: dead or dropped), then moves at most max_count
  messages whose due time has passed on the server clock — never one that is early —, those of
  the slot's priority index first (highest priority first, includes/due_by_priority.lua), then
  the due groups' in turn, each within its maxInFlightPerGroup (includes/due_by_group.lua),
  then store's in due order (in a slot with groups, those a group's turn does not take:
  includes/ungrouped_due.lua), and gives up instead those whose expiry has passed (never delivered
  after it). The batch bound keeps a burst of millions due at one instant from ever loading
  more than max_count into memory, and a byte bound (CLAIM_MAX_BYTES, 1 MiB of records; at
  least one message) keeps a claim of large payloads from holding more than a few MiB above
  maxmemory: what is left due stays due, and the reply's next_due_ms (at or before now) says so.

  Recurring schedules: claiming the current occurrence of a schedule (`<sid>@<due>` whose
  schedule names `due` as its current one) materialises its precomputed successor in this same
  call, so the series goes on whatever becomes of this delivery (handler failure, crash). The
  schedule then owes a top-up (the successor's successor, computed in Python): its id joins
  `topup`, and the reply's topups_owed tells the owner to run topup-7. A successor already
  due when its predecessor is claimed means the predecessor was missed (downtime): with catch-up
  `once` it is delivered and no successor is materialised (the top-up resumes after now), with
  `skip` it is dropped as well (event `skipped`), with `all` everything is delivered.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] epoch    STRING fencing epoch of the slot owner
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] leases   STRING the last lease number drawn in the slot (never repeats)
  KEYS[9] outcome  HASH id -> remembered outcome of a finished message
  KEYS[10] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[11] schedules HASH schedule id -> packed schedule (series_fields)
  KEYS[12] topup   ZSET schedule id -> ms since its top-up is owed
  KEYS[13] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them; and the slot's
  priority index, named from its store key: includes/priority_key.lua, and its fair groups'
  parts and the record's max_in_flight_per_group: includes/group_keys.lua)

  ARGV[1] epoch           the caller's fencing epoch
  ARGV[2] max_count       at most this many messages claimed
  ARGV[3] lease_ms        lease length; the deadline is server now + lease_ms
  ARGV[4] max_retries     attempts beyond this are dead (record)
  ARGV[5] journal_max_len  0 = journal off (record)
  ARGV[6] rollback_max    at most this many expired leases rolled back in this call
  ARGV[7] retry_for_ms    retries end this long after the first attempt (0 = no window)
                          (record)
  ARGV[8] retry_exhausted_action  'dead' | 'drop' once retries are exhausted (record)
  ARGV[9] expiry_action   'dead' | 'drop' for a message past its expiry (record)
  ARGV[10] outcome_retention_ms  0 = dropped messages are not remembered (record)
  ARGV[11] backoff_base_ms  an expired lease's retry is due base * multiplier^(attempts-1),
                            capped at backoff_max_ms, after its lease's deadline (0 or
                            absent: redelivered at once)
  ARGV[12] backoff_multiplier
  ARGV[13] backoff_max_ms
  ARGV[14] backoff_spread   full jitter: a random fraction in [0, 1) drawn by the caller;
                            '' = no jitter (retry_delay.lua)

  Returns {code, now_us, next_due_ms, next_deadline_ms, topups_owed, id1, record1, ...}
     0 OK           next_due_ms / next_deadline_ms are -1 when store / prepare is empty;
                    each record carries the incremented attempt count, the due time and
                    the lease number of this claim (the lease token's `lease`);
                    topups_owed counts the slot's schedules waiting for topup-7
    -2 STALE_EPOCH  the caller is not the current owner: nothing was changed
                    now_us is the server clock in microseconds (due times are compared in whole
                    ms): consumers time their next wake-up from it without flooring error

  Runs under maxmemory (allow-oom): a claim moves messages between the slot's keys and grows
  nothing but the bounded journal, and a full Redis must keep delivering (acks free memory).

  Events: expired (lease rolled back), dead or dropped (attempts exhausted, or the message
  expired: reason 'expired'), claimed, orphan (an id with no record: removed so it can never
  block the slot), scheduled (a schedule's next occurrence), skipped (a missed occurrence of a
  schedule with catch-up `skip`)
]]
--@include claim_slot
--@include now_us

return claim_slot(KEYS, 0, ARGV, now_us())
