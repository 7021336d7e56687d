#!lua flags=allow-oom
--[[
  Claim due messages of one slot (two-phase consumption, phase one): store -> prepare with a lease.
  First rolls expired leases back (each expiry counts as a failed attempt, retried after the
  caller's retry backoff as a nack is; past max_retries or the retry window the message is
  given up: dead or dropped), then moves at most max_count
  messages whose due time has passed on the server clock — never one that is early — and gives
  up instead those whose expiry has passed (never delivered after it). The batch bound keeps a
  burst of millions due at one instant from ever loading more than max_count into memory.

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
  ARGV values marked (record), which stay the fallback while it lacks them)

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
  ARGV[11] backoff_base_ms  an expired lease's retry waits base * multiplier^(attempts-1),
                            capped at backoff_max_ms (0 or absent: redelivered at once)
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
--@include call_chunked
--@include codes
--@include epoch_matches
--@include forget_expired
--@include give_up
--@include journal
--@include materialize
--@include now_us
--@include occurrence_record
--@include read_chunked
--@include record_extras
--@include record_fields
--@include record_with
--@include roll_back_leases
--@include series_fields
--@include series_with
--@include topic_settings
--@include with_first_attempt

local store, prepare, msg, epoch_key, journal_key, leases_key =
  KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[7], KEYS[8]
local schedules, topup = KEYS[11], KEYS[12]
local max_count = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local rollback_max = tonumber(ARGV[6])
local max_retries, journal_max_len, retry_for_ms, exhausted_action, expiry_action, retention_ms =
  topic_settings(KEYS[1], {'max_retries', 'journal_max_len', 'retry_for_ms',
    'retry_exhausted_action', 'expiry_action', 'outcome_retention_ms'},
    {ARGV[4], ARGV[5], ARGV[7], ARGV[8], ARGV[9], ARGV[10]})
max_retries, journal_max_len = tonumber(max_retries), tonumber(journal_max_len)
retry_for_ms = tonumber(retry_for_ms)
local slot = {
  dead = KEYS[3], reason = KEYS[5], msg = msg, journal = journal_key, outcome = KEYS[9],
  finished = KEYS[10], basis = KEYS[13], journal_max_len = journal_max_len, retention_ms = tonumber(retention_ms),
}
local given_up = 0

if not epoch_matches(epoch_key, ARGV[1]) then
  return {CODE.STALE_EPOCH, 0, -1, -1, 0}
end
local now_micros = now_us()
local now = math.floor(now_micros / 1000)

-- The claimed message `id` as an occurrence of a recurring schedule (header): materialise the
-- successor, or note a missed occurrence. True when the occurrence is to be skipped.
local function advance_series(id)
  local sid, due = string.match(id, '^(.+)@(%d+)$')
  local value = sid and redis.call('HGET', schedules, sid)
  if not value then return false end
  local current, nxt, catch_up = series_fields(value)
  if current ~= due or nxt == '' or nxt == 'end' then return false end
  local missed = tonumber(nxt) <= now and catch_up ~= 'all'
  if missed then
    value = series_with(value, current, '')
  else
    materialize(store, msg, journal_key, journal_max_len, sid, nxt, occurrence_record(value), now)
    value = series_with(value, nxt, '')
  end
  redis.call('HSET', schedules, sid, value)
  redis.call('ZADD', topup, now, sid)
  return missed and catch_up == 'skip'
end

-- 1. Roll back expired leases, each retried after the caller's backoff.
local backoff = nil
if ARGV[11] and tonumber(ARGV[11]) > 0 then
  backoff = {base_ms = tonumber(ARGV[11]), multiplier = tonumber(ARGV[12]),
    max_ms = tonumber(ARGV[13]), spread = tonumber(ARGV[14])}
end
local expired = redis.call('ZRANGEBYSCORE', prepare, '-inf', now, 'LIMIT', 0, rollback_max)
given_up = roll_back_leases(slot, store, prepare, expired, now, max_retries, retry_for_ms,
  exhausted_action, backoff)

-- 2. Claim what is due.
local claimed = {CODE.OK, now_micros, -1, -1, 0}
local due_ids = redis.call('ZRANGEBYSCORE', store, '-inf', now, 'WITHSCORES', 'LIMIT', 0, max_count)
if #due_ids > 0 then
  local has_series = redis.call('HLEN', schedules) > 0
  local deadline = now + lease_ms
  local lease = tostring(redis.call('INCR', leases_key))
  local ids, hset_args = {}, {}
  for i = 1, #due_ids, 2 do ids[#ids + 1] = due_ids[i] end
  local records = read_chunked('HMGET', msg, ids)
  for k = 1, #ids do
    local id, due, record = ids[k], due_ids[2 * k], records[k]
    local attempts, _, p3, expire_ms = nil, nil, nil, nil
    if record then
      attempts, _, _, p3 = record_fields(record)
      expire_ms = record_extras(record, p3)
    end
    if record and expire_ms and now > expire_ms then
      give_up(slot, id, expiry_action, 'expired', 'expired', now, due, attempts)
      given_up = given_up + 1
    elseif record and has_series and advance_series(id) then
      redis.call('HDEL', msg, id)
      redis.call('HDEL', slot.basis, id)
      journal(journal_key, journal_max_len, 'skipped', id, now, due, '')
    elseif record then
      attempts = attempts + 1
      local leased = record_with(record, attempts, due, lease, p3)
      -- the retry window's start, kept only where a window is set (no bytes otherwise)
      if attempts == 1 and retry_for_ms > 0 then leased = with_first_attempt(leased, now) end
      hset_args[#hset_args + 1] = id
      hset_args[#hset_args + 1] = leased
      claimed[#claimed + 1] = id
      claimed[#claimed + 1] = leased
      journal(journal_key, journal_max_len, 'claimed', id, now, due, attempts)
    else
      redis.call('HDEL', slot.basis, id)
      journal(journal_key, journal_max_len, 'orphan', id, now, due, '')
    end
  end
  call_chunked('ZREM', store, ids)
  if #hset_args > 0 then
    -- The leased ids go into prepare last one first. They share one deadline, and a sorted set
    -- of up to 128 members (a listpack) looks for an equal-score member's place from its head:
    -- ids claimed in ascending order (store's order for ids due together) would each walk
    -- past all those just added: ~0.9 µs of ZADD a claimed message instead of ~0.5 with the
    -- default consumer's claims of 125 (docs/benchmarks.md, "Hot paths").
    local zadd_args = {}
    for k = #hset_args - 1, 1, -2 do
      zadd_args[#zadd_args + 1] = deadline
      zadd_args[#zadd_args + 1] = hset_args[k]
    end
    call_chunked('ZADD', prepare, zadd_args)
    call_chunked('HSET', msg, hset_args)
  end
end

if given_up > 0 then
  forget_expired(slot.outcome, slot.finished, slot.basis, slot.msg, slot.retention_ms, now,
    given_up)
end

local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
if head[2] then claimed[3] = tonumber(head[2]) end
local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
if lease_head[2] then claimed[4] = tonumber(lease_head[2]) end
claimed[5] = redis.call('ZCARD', topup)
return claimed
