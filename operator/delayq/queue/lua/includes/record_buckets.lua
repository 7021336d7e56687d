--@include existing_count
--@include bucket_groups
--@include compacted_record
--@include expanded_record
--@include bucket_of
--@include id_hash
--@include settings_record

-- What the change tracking wraps (queue/scripts.py binds
-- `local redis = track_changes(record_buckets(redis))`): the server's `redis`, but its `call`,
-- which track_changes sends HGET, HMGET, HSET and HDEL on a slot's `msg` key to (`is_records`),
-- reaches the slot's records wherever they are kept, so that no script names where
-- (docs/contracts.md §1, "Records in buckets").
--
-- A slot's records are in its `msg` hash, or in buckets: the hashes `<msg key>:<b>`, b in
-- 0 .. n - 1, each small enough that Redis keeps it one listpack (≈ 68 B a record of a 40-byte
-- payload, where the one large `msg` hash costs ≈ 123). The slot's `buckets` hash ({n, count}:
-- how many buckets, how many records they hold) exists while any bucket may hold a record;
-- then reads look in the record's bucket and then in `msg`. Writes go where the slot's
-- settings record says (`redis_record_buckets`, the topic's recordBuckets, which the topic's
-- owner publishes as True only once every functions library on the broker reads buckets):
-- into the bucket or into `msg`, and each deletes the record's other copy, so an id is in one
-- place at most. Nothing is moved in bulk: records move as they are written, and a slot whose
-- buckets empty while it writes to `msg` drops its `buckets` hash.
--
-- The buckets grow one at a time (linear hashing), so none holds more than about twice LOAD:
-- with n buckets and 2^L <= n < 2^(L+1), a record whose hash h has h mod 2^L below n - 2^L lives
-- in bucket h mod 2^(L+1), every other one in h mod 2^L. When the records pass LOAD a bucket,
-- bucket n - 2^L is split: its records whose h mod 2^(L+1) is n move to the new bucket n (a
-- bucket that passed Redis's listpack limit is written anew, as it is a hash table until it is
-- recreated). Buckets are never merged; Redis deletes an emptied one. Records only move to a
-- higher bucket, so a reader that scans the buckets in order while the slot grows sees each
-- one at least once (queue/record_buckets.py). h is `id_hash`.
local function record_buckets(redis)
  local LOAD = 48  -- records a bucket holds on average
  local LISTPACK_ENTRIES = 128  -- Redis's hash-max-listpack-entries
  local sub, byte, tonumber = string.sub, string.byte, tonumber
  local slots = {}  -- `msg` key -> its state in this call (see state_of)
  local hashes = {}  -- id -> h, for this call: a script reads and then writes the same ids
  -- `msg` key -> the slot record's redis_record_buckets, read in this call, or false when the
  -- record has none: then the slot's records are in `msg` alone (state_of), and the change
  -- tracking, which sees this table as `wrapper.noted`, sends the key's commands straight to
  -- the server without a call of this wrapper
  local noted = {}
  -- the keys of a call over many slots (`unbucketed_slots`: keys, first, step), asked about
  -- at the first of its slots whose record has the field: one EXISTS of all their `buckets`
  local candidates = nil
  local wrapper

  local function begin_call()
    candidates = nil
    if next(slots) then slots = {} end
    if next(hashes) then hashes = {} end
    if next(noted) then
      noted = {}
      wrapper.noted = noted
    end
  end

  local function hash_of(id)
    local h = hashes[id]
    if not h then
      h = id_hash(id)
      hashes[id] = h
    end
    return h
  end

  -- The slot's settings record's redis_record_buckets: as topic_settings read it in this
  -- call (store_buckets's `note_layout` writes it into `noted`), else asked here; false when
  -- the record has none.
  local function recorded(msg)
    local value = noted[msg]
    if value == nil then
      value = redis.call('HGET', settings_record(msg), 'redis_record_buckets') or false
      noted[msg] = value
    end
    return value
  end

  -- Whether the slot's settings record wants buckets.
  local function wants_buckets(msg)
    return recorded(msg) == 'True'
  end

  -- When none of the candidates has a `buckets` hash, each is 'unasked' for the rest of the
  -- call.
  local function ask_candidates()
    local keys, first, step = unpack(candidates)
    candidates = nil
    local names, msgs = {}, {}
    for i = first, #keys, step do
      local prefix = string.match(keys[i], '^(dq:{.*}:)%a+$')
      names[#names + 1] = prefix .. 'buckets'
      msgs[#msgs + 1] = prefix .. 'msg'
    end
    if existing_count(names) > 0 then return end
    for _, msg in ipairs(msgs) do
      if slots[msg] == nil then slots[msg] = 'unasked' end
    end
  end

  -- The slot's state in this call: 'unasked' while it has no `buckets` hash (its record not
  -- asked yet: only a write asks), false when it has none and its record wants none, else
  -- {meta, n, count, legacy (`msg` may hold records), to_buckets (asked by the first write)}.
  -- Returns false for the first two: the slot's records are in `msg` alone. A slot whose
  -- settings record lacks redis_record_buckets has no `buckets` hash (the owner writes the
  -- field once the topic turns buckets on and keeps it from then on, publish-1; a slot's copy
  -- onto a broker whose record lacks it brings its records into `msg`, queue/slot_copy.py):
  -- its `buckets` hash is not asked for, so topics that never had buckets pay one HMGET field
  -- (of a read the call makes anyway, topic_settings) and no lookup a slot.
  local function state_of(msg, writing)
    local state = slots[msg]
    if state == nil then
      state = 'unasked'
      if recorded(msg) then
        if candidates then ask_candidates() end
        if slots[msg] == nil then
          local meta = sub(msg, 1, -4) .. 'buckets'
          local n, count = unpack(redis.call('HMGET', meta, 'n', 'count'))
          if n then
            state = {meta = meta, n = tonumber(n), count = tonumber(count),
              legacy = redis.call('EXISTS', msg) == 1}
          end
        end
      end
      slots[msg] = state
    end
    if writing and state == 'unasked' then
      state = false
      if wants_buckets(msg) then
        state = {meta = sub(msg, 1, -4) .. 'buckets', n = 1, count = 0,
          legacy = redis.call('EXISTS', msg) == 1, to_buckets = true}
        redis.call('HSET', state.meta, 'n', state.n, 'count', state.count)
      end
      slots[msg] = state
    elseif writing and state and state.to_buckets == nil then
      state.to_buckets = wants_buckets(msg)
    end
    return state ~= 'unasked' and state
  end

  -- `keys[first]`, `keys[first + step]`, ... name one key of each slot of a call over many
  -- slots (schedulemany-1, claimmany-13, ackmany-7): when none of them has a `buckets` hash
  -- (one EXISTS for all, made once a slot's record has the field: state_of), their reads
  -- skip the lookup for the rest of the call.
  local function unbucketed_slots(keys, first, step)
    candidates = {keys, first, step}
  end

  local function gathered(args, positions, width)
    local out = {}
    for _, i in ipairs(positions) do
      for k = 0, width - 1 do out[#out + 1] = args[i + k] end
    end
    return out
  end

  local function hmget(msg, state, ids)
    local out = {}
    for i = 1, #ids do out[i] = false end
    local groups, order = bucket_groups(ids, 1, 1, state.n, hash_of)
    for _, b in ipairs(order) do
      local positions = groups[b]
      local got = redis.call('HMGET', msg .. ':' .. b, unpack(gathered(ids, positions, 1)))
      for k, i in ipairs(positions) do out[i] = expanded_record(got[k]) end
    end
    if state.legacy then
      local missing = {}
      for i = 1, #ids do
        if not out[i] then missing[#missing + 1] = i end
      end
      if #missing > 0 then
        local got = redis.call('HMGET', msg, unpack(gathered(ids, missing, 1)))
        for k, i in ipairs(missing) do out[i] = got[k] end
      end
    end
    return out
  end

  local function split(msg, state)
    local n = state.n
    local low = 1
    while low * 2 <= n do low = low * 2 end
    local bucket = msg .. ':' .. (n - low)
    local flat = redis.call('HGETALL', bucket)
    local kept, moved, gone = {}, {}, {}
    for i = 1, #flat, 2 do
      local into = hash_of(flat[i]) % (low * 2) == n and moved or kept
      into[#into + 1] = flat[i]
      into[#into + 1] = flat[i + 1]
      if into == moved then gone[#gone + 1] = flat[i] end
    end
    if #moved > 0 then
      redis.call('HSET', msg .. ':' .. n, unpack(moved))
      if #flat / 2 > LISTPACK_ENTRIES then  -- a hash table: recreated, a listpack again
        redis.call('DEL', bucket)
        if #kept > 0 then redis.call('HSET', bucket, unpack(kept)) end
      else
        redis.call('HDEL', bucket, unpack(gone))
      end
    end
    state.n = n + 1
  end

  -- Delete the ids at positions first, first + stride, ... of `args` from their buckets.
  local function delete_from_buckets(msg, state, args, first, stride)
    local groups, order = bucket_groups(args, first, stride, state.n, hash_of)
    local removed = 0
    for _, b in ipairs(order) do
      local ids = gathered(args, groups[b], 1)
      removed = removed + redis.call('HDEL', msg .. ':' .. b, unpack(ids))
    end
    state.count = state.count - removed
    return removed
  end

  -- After a write: the count kept, or the `buckets` hash dropped once the buckets are empty
  -- and the slot writes to `msg` (its reads then look nowhere else). Empty is asked of the
  -- buckets themselves, not only of the count: a record dropped from sight would be lost.
  local function settle(msg, state)
    local meta = state.meta
    if state.count == 0 and not state.to_buckets then
      local buckets = {}
      for b = 0, state.n - 1 do buckets[#buckets + 1] = msg .. ':' .. b end
      if existing_count(buckets) == 0 then
        redis.call('DEL', meta)
        slots[msg] = false
        return
      end
    end
    redis.call('HSET', meta, 'n', state.n, 'count', state.count)
  end

  local function ids_of(args)
    local ids = {}
    for i = 1, #args, 2 do ids[#ids + 1] = args[i] end
    return ids
  end

  local function hset(msg, state, args)
    local added = 0
    if state.to_buckets then
      for i = 2, #args, 2 do args[i] = compacted_record(args[i]) end
      local groups, order = bucket_groups(args, 1, 2, state.n, hash_of)
      for _, b in ipairs(order) do
        added = added + redis.call('HSET', msg .. ':' .. b, unpack(gathered(args, groups[b], 2)))
      end
      if state.legacy then redis.call('HDEL', msg, unpack(ids_of(args))) end
      state.count = state.count + added
      while state.count > state.n * LOAD do split(msg, state) end
    else
      added = redis.call('HSET', msg, unpack(args))
      state.legacy = true
      delete_from_buckets(msg, state, args, 1, 2)
    end
    settle(msg, state)
    return added
  end

  local function hdel(msg, state, ids)
    local removed = delete_from_buckets(msg, state, ids, 1, 1)
    if state.legacy then removed = removed + redis.call('HDEL', msg, unpack(ids)) end
    settle(msg, state)
    return removed
  end

  -- Whether `key` is a slot's `msg` key (`dq:{<tag>}:msg`), told by its bytes: no string is
  -- made for it, since the change tracking asks it of every HGET, HMGET, HSET and HDEL.
  local function is_records(key)
    local c1, c2, c3, c4 = byte(key, -4, -1)
    if c4 ~= 103 or c3 ~= 115 or c2 ~= 109 or c1 ~= 58 then return false end  -- ':msg'
    local d1, d2, d3, d4 = byte(key, 1, 4)
    return d1 == 100 and d2 == 113 and d3 == 58 and d4 == 123  -- 'dq:{'
  end

  local WRITES = {HSET = hset, HDEL = hdel}
  -- HGET, HMGET, HSET or HDEL on a slot's `msg` key (`is_records`).
  local function call(command, msg, ...)
    local write = WRITES[command]
    local state = state_of(msg, write ~= nil)
    if not state then return redis.call(command, msg, ...) end
    if command == 'HGET' then  -- the one record of most transitions
      local id = (...)
      local bucket = msg .. ':' .. bucket_of(hash_of(id), state.n)
      local got = expanded_record(redis.call('HGET', bucket, id))
      if not got and state.legacy then got = redis.call('HGET', msg, id) end
      return got
    end
    if write then return write(msg, state, {...}) end
    return hmget(msg, state, {...})
  end

  wrapper = setmetatable({call = call, is_records = is_records, server_call = redis.call,
    begin_call = begin_call, noted = noted,
    unbucketed_slots = unbucketed_slots},
    {__index = redis})
  return wrapper
end
