--@include call_chunked
--@include claim_max_bytes
--@include codes
--@include due_by_group
--@include due_by_priority
--@include epoch_matches
--@include forget_expired
--@include give_up
--@include groups_next_due
--@include group_keys
--@include group_member
--@include integer_text
--@include journal
--@include materialize
--@include occurrence_record
--@include priority_key
--@include record_extras
--@include record_fields
--@include record_group
--@include record_with
--@include rescore_groups
--@include roll_back_leases
--@include series_fields
--@include series_with
--@include topic_settings
--@include ungrouped_due
--@include unpack_chunk
--@include with_first_attempt

-- Claim due messages of one slot: the body of claim-13 (whose header is the contract: KEYS,
-- ARGV, reply, events) and of claimmany-1, which runs it once per slot, each slot fenced by its
-- own epoch. `keys[at + 1 .. at + 13]` are the slot's keys in claim-13's KEYS order, `args`
-- the slot's claim-13 ARGV; `now_micros` the server clock in µs (one reading per call);
-- `known` what claimmany-1 asked once for all its slots, or nil: `epoch` the slot's epoch
-- (false: unset), `series_absent` true when no slot of the call has schedules, `topups_absent`
-- true when none owed a top-up at the call's start, `budget` the call's bytes left to claim
-- ({left = n}, shared by its slots; CLAIM_MAX_BYTES when absent). Returns claim-13's reply.
local function claim_slot(keys, at, args, now_micros, known)
  local store, prepare, msg, epoch_key, journal_key, leases_key =
    keys[at + 1], keys[at + 2], keys[at + 4], keys[at + 6], keys[at + 7], keys[at + 8]
  local schedules, topup = keys[at + 11], keys[at + 12]
  local max_count = tonumber(args[2])
  local lease_ms = tonumber(args[3])
  local rollback_max = tonumber(args[6])
  -- the bound on a group's leases is the record's only (0, none, while it has none)
  local max_retries, journal_max_len, retry_for_ms, exhausted_action, expiry_action, retention_ms,
      max_in_flight = topic_settings(keys[at + 1], {'max_retries', 'journal_max_len',
      'retry_for_ms', 'retry_exhausted_action', 'expiry_action', 'outcome_retention_ms',
      'max_in_flight_per_group'}, {args[4], args[5], args[7], args[8], args[9], args[10], '0'})
  max_retries, journal_max_len = tonumber(max_retries), tonumber(journal_max_len)
  max_in_flight = tonumber(max_in_flight)
  retry_for_ms = tonumber(retry_for_ms)
  local slot = {
    dead = keys[at + 3], reason = keys[at + 5], msg = msg, journal = journal_key,
    outcome = keys[at + 9], finished = keys[at + 10], basis = keys[at + 13],
    journal_max_len = journal_max_len, retention_ms = tonumber(retention_ms),
  }
  local given_up = 0
  known = known or {}
  local topped_up = false  -- a top-up owed since the call began (advance_series)

  if not epoch_matches(epoch_key, args[1], known.epoch) then
    return {CODE.STALE_EPOCH, 0, -1, -1, 0}
  end
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
    topped_up = true
    return missed and catch_up == 'skip'
  end

  -- 1. Roll back expired leases, each retried after the caller's backoff.
  local backoff = nil
  if args[11] and tonumber(args[11]) > 0 then
    backoff = {base_ms = tonumber(args[11]), multiplier = tonumber(args[12]),
      max_ms = tonumber(args[13]), spread = tonumber(args[14])}
  end
  -- prepare's head says whether any lease is over: only then is prepare read by range (and
  -- its head again at the end, `lease_head` false); while none is, the head read here and the
  -- claim's own deadline make the reply's lease head. A slot claimed for a message or two
  -- (a steady topic's usual claim) pays each command, ~3 µs of a claim's ~45 µs a slot.
  local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')[2]
  local expired = {}
  if lease_head and tonumber(lease_head) <= now then
    expired = redis.call('ZRANGEBYSCORE', prepare, '-inf', now, 'LIMIT', 0, rollback_max)
    lease_head = false
  end
  given_up = roll_back_leases(slot, store, prepare, expired, now, max_retries, retry_for_ms,
    exhausted_action, backoff)

  -- 2. Claim what is due: the priority index's first (highest priority first), then the
  -- groups' in turn (due_by_group), then store's in due order (in a slot with groups, those
  -- without: ungrouped_due).
  -- whether the slot has a priority index or fair groups at all, one EXISTS for both (after
  -- the roll-back, which may index a message again); each pass asks its own only if so
  local wait, groups_key, leases = group_keys(store)
  local unindexed = redis.call('EXISTS', priority_key(store), groups_key) == 0
  local claimed = {CODE.OK, now_micros, -1, -1, 0}
  local due_ids = due_by_priority(store, now, max_count, unindexed)
  local prioritized = #due_ids / 2
  local seen = {}
  for i = 1, #due_ids, 2 do seen[due_ids[i]] = true end
  local grouped, visited, has_groups = due_by_group(store, keys[at + 2], now, now_micros,
    max_count - prioritized, max_in_flight, seen, unindexed)
  for i = 1, #grouped, 2 do
    seen[grouped[i]] = true
    due_ids[#due_ids + 1] = grouped[i]
    due_ids[#due_ids + 1] = grouped[i + 1]
  end
  local indexed = #due_ids / 2
  local room = max_count - indexed
  if has_groups then
    local rest = ungrouped_due(store, msg, now, room, seen, indexed + 4 * max_count)
    for k = 1, #rest do due_ids[#due_ids + 1] = rest[k] end
  elseif indexed == 0 then
    due_ids = redis.call('ZRANGEBYSCORE', store, '-inf', now, 'WITHSCORES', 'LIMIT', 0, max_count)
  elseif room > 0 then
    -- the index's ones are still in store: skip them there
    local rest = redis.call('ZRANGEBYSCORE', store, '-inf', now, 'WITHSCORES', 'LIMIT', 0,
      room + indexed)
    for i = 1, #rest, 2 do
      if room > 0 and not seen[rest[i]] then
        due_ids[#due_ids + 1] = rest[i]
        due_ids[#due_ids + 1] = rest[i + 1]
        room = room - 1
      end
    end
  end
  local leased_until = nil  -- the deadline of the leases this claim added to prepare, if any
  if #due_ids > 0 then
    local has_series = not known.series_absent and redis.call('HLEN', schedules) > 0
    -- once as its text (integer_text), not once a claimed message by Redis's "%.17g"
    local deadline = integer_text(now + lease_ms)
    local lease = tostring(redis.call('INCR', leases_key))
    local ids, hset_args = {}, {}
    for i = 1, #due_ids, 2 do ids[#ids + 1] = due_ids[i] end
    -- The records are read a chunk at a time, each chunk sized by the largest record seen so
    -- far to what is left of the call's CLAIM_MAX_BYTES (`known.budget`, shared by the slots
    -- of a claimmany-1): a claim holds about five copies of what it claims at once (the
    -- records read, the leased records, Redis's new values, the AOF buffer, the reply), above
    -- maxmemory, and must not push a full broker's container past its memory limit. Small
    -- messages read in two chunks; ids not reached stay due (the reply's next due says so).
    local budget = known.budget or {left = CLAIM_MAX_BYTES}
    local records, taken, largest = {}, 0, 0
    local k = 0
    while k < #ids and budget.left > 0 do
      if k == taken then
        local n = 1
        if largest > 0 then n = math.floor(budget.left / largest) end
        n = math.max(1, math.min(n, #ids - taken, UNPACK_CHUNK))
        local part = redis.call('HMGET', msg, unpack(ids, taken + 1, taken + n))
        for j = 1, n do
          records[taken + j] = part[j]
          if part[j] and #part[j] > largest then largest = #part[j] end
        end
        taken = taken + n
      end
      k = k + 1
      local id, due, record = ids[k], due_ids[2 * k], records[k]
      if record then budget.left = budget.left - #record end
      local attempts, _, p3, expire_ms, group = nil, nil, nil, nil, nil
      if record then
        attempts, _, _, p3 = record_fields(record)
        expire_ms = record_extras(record, p3)
        group = record_group(record, p3)
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
        if group then
          redis.call('ZREM', wait, group_member(group, due, id))
          redis.call('ZADD', leases, 0, group .. '\0' .. id)
        end
        journal(journal_key, journal_max_len, 'claimed', id, now, due, attempts)
      else
        redis.call('HDEL', slot.basis, id)
        journal(journal_key, journal_max_len, 'orphan', id, now, due, '')
      end
    end
    for j = #ids, k + 1, -1 do ids[j] = nil end  -- past the byte budget: still due
    call_chunked('ZREM', store, ids)
    if prioritized > 0 then call_chunked('ZREM', priority_key(store), ids) end
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
      leased_until = tonumber(deadline)
    end
  end

  rescore_groups(store, visited, now_micros)
  if given_up > 0 then
    forget_expired(slot.outcome, slot.finished, slot.basis, slot.msg, slot.retention_ms, now,
      given_up)
  end

  if has_groups and #due_ids < 2 * max_count then
    -- a short batch in a slot with groups: what is still due waits for a group's turn (or
    -- lease: end_group_lease wakes the slot), so the next due is the earlier of the first
    -- turn and the first message not due yet, never 'due now' (the consumer would claim again
    -- at once, for nothing)
    claimed[3] = groups_next_due(store, now)
  else
    local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
    if head[2] then claimed[3] = tonumber(head[2]) end
  end
  if lease_head == false then  -- leases rolled back: read the head again
    lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')[2]
  end
  local earliest = lease_head and tonumber(lease_head)
  if leased_until and (not earliest or leased_until < earliest) then earliest = leased_until end
  if earliest then claimed[4] = earliest end
  if topped_up or not known.topups_absent then claimed[5] = redis.call('ZCARD', topup) end
  return claimed
end
