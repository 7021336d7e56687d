--@include append
--@include call_chunked
--@include codes
--@include end_group_lease
--@include index_group
--@include index_priority
--@include integer_text
--@include journal
--@include locate
--@include new_record
--@include priority_key
--@include read_chunked
--@include record_fields
--@include remembered
--@include schedule_fields
--@include settings_record
--@include wake_if_earliest

-- Schedule messages into one slot, appending each one's triple (code, due_ms, state) to
-- `results`: the body of schedule-10 (whose header is the contract: KEYS, ARGV, codes) and of
-- schedulemany-1, which runs it once per slot. `prefix` names the slot's keys: each is the
-- prefix and its part (`dq:{<tag>}:` .. 'store'), made only when the slot's messages need that
-- part (a slot's journal, outcome, prepare, dead and basis parts are looked at only when the
-- topic journals, remembers outcomes, has a quota, an id exists or a basis is given), so a
-- call over hundreds of slots declares one key a slot, not ten (schedulemany-1); `args[1 ..
-- 7]` the head of schedule-10's ARGV; `args[first .. last]` the slot's messages, args[7]
-- values each (the ninth a priority, the tenth a group, '' for none); `now` the server clock in ms (one reading per call: TIME
-- is a command, and a call of many slots would pay it once a slot); `bases_absent` true when
-- the caller knows the slot has no basis entries (schedulemany-1 asks once for all its slots).
-- The caller has refused a moving slot already.
local function schedule_slot(prefix, args, first, last, now, bases_absent, results)
  local store, msg = prefix .. 'store', prefix .. 'msg'
  local upsert = args[1] == 'upsert'
  local fields = schedule_fields(args[7])
  local max_delay_ms = tonumber(args[2])
  -- the slot's settings record, as topic_settings reads it (a field it holds wins over the
  -- caller's; the records' wrapper is told where the slot writes its records), its fields
  -- named in the HMGET: a call over many slots reads one record a
  -- slot, and topic_settings' tables and unpacks took 5 % of Redis's CPU a message at 1,024
  -- slots (docs/benchmarks.md, "Hot paths")
  local record = redis.call('HMGET', settings_record(store), 'journal_max_len',
    'outcome_retention_ms', 'expiry_ttl_ms', 'limits_max_pending', 'redis_record_buckets',
    'redis_store_buckets', 'redis_store_buckets_after_ms')
  redis.note_layout(msg, store, record[5], record[6], record[7])
  local journal_max_len = tonumber(record[1] or args[3])
  local retention_ms = tonumber(record[2] or args[4])
  local default_ttl_ms = tonumber(record[3] or args[5])
  local max_pending = tonumber(record[4] or args[6])

  local zadd_args, hset_args = {}, {}
  local absent = {}  -- the ids written that had no record: in no store and no bucket
  -- id -> the slot basis it is stored with, or false to delete an entry it may have (of the
  -- message it replaces, or of a finished one kept with its outcome: forget_bases), looked for
  -- only in a slot that has entries, so default-basis batches pay nothing; written after the
  -- loop, so the last of an id given twice in the batch wins
  local has_bases = not bases_absent and redis.call('HLEN', prefix .. 'basis') > 0
  local bases, based_ids = {}, {}
  local pending = {}  -- id -> due, for ids scheduled earlier in this same batch
  -- a replaced message leaves the priority index, asked once whether the slot has one
  local index_absent = nil
  local earliest = nil

  -- a live message always has its record: one HMGET tells which ids exist (new ids cost no
  -- copy)
  local ids = {}
  for i = first, last, fields do ids[#ids + 1] = args[i] end
  local prepare, dead = nil, nil  -- named when a quota counts or an id exists
  local pending_count = nil  -- scheduled + prepared, counted when a limit is set
  if max_pending > 0 then
    prepare = prefix .. 'prepare'
    pending_count = redis.call('ZCARD', store) + redis.call('ZCARD', prepare)
  end
  local records = read_chunked('HMGET', msg, ids)
  -- create-only asks what finished ids left behind; upsert replaces whatever there was
  local outcomes = {}
  if retention_ms > 0 and not upsert then
    outcomes = read_chunked('HMGET', prefix .. 'outcome', ids)
  end
  local journal_key = journal_max_len > 0 and prefix .. 'journal'

  for k = 1, #ids do
    local i = first + fields * (k - 1)
    local id, when_kind, when_ms = ids[k], args[i + 1], tonumber(args[i + 2])
    local expire_kind, expire_value = args[i + 3], tonumber(args[i + 4])
    local due = when_ms
    if when_kind == 'delay' then due = now + when_ms end
    local expire_ms = nil
    if expire_kind == 'at' then
      expire_ms = expire_value
    elseif expire_kind == 'ttl' then
      expire_ms = due + expire_value
    elseif default_ttl_ms > 0 then
      expire_ms = due + default_ttl_ms
    end
    local state, score = false, nil
    if pending[id] then
      state, score = 'scheduled', pending[id]
    elseif records[k] then
      prepare, dead = prefix .. 'prepare', prefix .. 'dead'
      state, score = locate(store, prepare, dead, id)
    end

    local finished_state, finished_ms = nil, nil
    if not state then
      finished_state, finished_ms = remembered(outcomes[k], retention_ms, now)
    end

    if due > now + max_delay_ms then
      append(results, CODE.TOO_FAR, due, state or 'absent')
    elseif expire_ms and expire_ms <= due then
      append(results, CODE.EXPIRES_BEFORE_DUE, due, state or 'absent')
    elseif pending_count and not state and not finished_state
        and pending_count >= max_pending then
      append(results, CODE.OVER_QUOTA, due, 'absent')
    elseif finished_state then
      append(results, CODE.ALREADY_DONE, finished_ms, finished_state)
    elseif state and not upsert then
      local shown = score
      if state == 'prepared' then
        local _, record_due = record_fields(records[k])
        shown = tonumber(record_due) or score
      end
      append(results, CODE.EXISTS, shown, state)
    else
      if state == 'prepared' then
        redis.call('ZREM', prepare, id)
        end_group_lease(store, id, records[k], select(4, record_fields(records[k])), now)
      end
      if state then
        if index_absent == nil then
          index_absent = redis.call('EXISTS', priority_key(store)) == 0
        end
        if not index_absent then redis.call('ZREM', priority_key(store), id) end
      end
      local priority = fields > 8 and tonumber(args[i + 8]) or 0
      local group = fields > 9 and args[i + 9] ~= '' and args[i + 9] or nil
      if state == 'dead' then
        redis.call('ZREM', dead, id)
        redis.call('HDEL', prefix .. 'reason', id)
      end
      zadd_args[#zadd_args + 1] = integer_text(due)  -- not "%.17g" once a message
      zadd_args[#zadd_args + 1] = id
      hset_args[#hset_args + 1] = id
      hset_args[#hset_args + 1] = new_record(args[i + 5], args[i + 6], expire_ms, priority,
        group)
      if priority > 0 then
        index_priority(store, id, priority, due)
        index_absent = false
      end
      index_group(store, id, group, due)
      pending[id] = due
      local given_basis = args[i + 7]
      if given_basis ~= '' or has_bases then
        if bases[id] == nil then based_ids[#based_ids + 1] = id end
        bases[id] = given_basis ~= '' and given_basis
      end
      if pending_count and not state then pending_count = pending_count + 1 end
      if earliest == nil or due < earliest then earliest = due end
      journal(journal_key, journal_max_len, 'scheduled', id, now, due, 0)
      if state then
        append(results, CODE.UPDATED, due, 'scheduled')
      else
        absent[#absent + 1] = id
        append(results, CODE.CREATED, due, 'scheduled')
      end
    end
  end

  if #zadd_args > 0 then
    redis.note_absent(store, absent)
    call_chunked('ZADD', store, zadd_args)
    call_chunked('HSET', msg, hset_args)
    wake_if_earliest(store, prefix .. 'wake', earliest)
  end
  if #based_ids > 0 then
    local basis = prefix .. 'basis'
    local hset_bases, hdel_bases = {}, {}
    for _, id in ipairs(based_ids) do
      if bases[id] then
        hset_bases[#hset_bases + 1] = id
        hset_bases[#hset_bases + 1] = bases[id]
      else
        hdel_bases[#hdel_bases + 1] = id
      end
    end
    if #hset_bases > 0 then call_chunked('HSET', basis, hset_bases) end
    if #hdel_bases > 0 then call_chunked('HDEL', basis, hdel_bases) end
  end
end
