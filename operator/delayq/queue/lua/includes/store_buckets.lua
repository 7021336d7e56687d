--@include bucketed_part
--@include bucket_groups
--@include now_ms
--@include settings_record
--@include unpack_chunk

-- What the change tracking wraps, around record_buckets (queue/scripts.py binds
-- `local redis = track_changes(store_buckets(record_buckets(redis)))`): its `store_call`, to
-- which track_changes sends the sorted-set commands on a slot's `store` key (`is_store`),
-- reaches the slot's waiting messages wherever they are kept, so that no script names where
-- (docs/contracts.md §1, "Store in buckets").
--
-- A slot's waiting messages are in its `store` sorted set, or in buckets: the sorted sets
-- `<store key>:<b>` (≈ 28 B an entry, where the one large `store` costs ≈ 112), by the settings
-- record's `redis_store_buckets` (the topic's storeBuckets), with the slot's `storebuckets` hash
-- ({n, count}) beside them; where an entry is kept, how the buckets grow and how the slot goes
-- back to `store` alone is what both bucketed parts share (bucketed_part). The buckets are
-- picked by the id's hash, so a bucket holds messages of any due time: the slot's `heads`
-- sorted set (bucket -> the earliest due in it, non-empty buckets only) is what the reads in
-- due order go by, dropped with `storebuckets`. A message due within the settings record's
-- `redis_store_buckets_after_ms` (the topic's storeBucketsAfter; 0 where the record lacks it,
-- as the versions before it wrote) of the write is kept in `store` even so: a claim of
-- messages due soon then reads and deletes them in `store` (one command each), not one bucket
-- a message. Buckets picked by hash spread the messages due together over as many buckets as
-- there are messages once a slot holds many more messages than a claim takes: claim -> ack
-- amid 10M pending messages due a day out cost 1.60x what it cost amid 1M, 1.94x amid 50M,
-- and 1.17x and 1.25x with those messages in `store` (docs/benchmarks.md, "Messages due soon
-- stay out of the buckets"). A message scheduled further ahead is claimed from its bucket
-- when it comes due. The commands served are those the scripts send
-- to `store`: ZADD without flags, ZREM, ZSCORE, ZMSCORE, ZCARD, ZCOUNT, ZRANGE of the head and
-- ZRANGEBYSCORE with a LIMIT; any other form is an error, not a silent wrong answer.
--
-- A range read (ZRANGEBYSCORE) merges the buckets in the order of (score, bucket, id): the
-- buckets are visited in `heads` order and each is read only while it may still hold an entry
-- among the first offset + count, so a claim reads the buckets whose heads are due and a herd
-- due at one instant reads about count entries, not every bucket. Ids due at the same
-- instant come in bucket order instead of id order: the one order there is, the same for
-- every read of the same contents (a paged read does not skip or repeat).
local function store_buckets(redis)
  local HEADS_PAGE = 64  -- heads read at a time by a range read
  local AFTER_FIELD = 'redis_store_buckets_after_ms'
  local now = nil  -- this call's now_ms(), read at its first write into buckets
  -- store key -> its record's AFTER_FIELD as a number (0 when it has none), for this call
  local after = {}
  -- store key -> {id -> true}: ids its caller knows are in neither `store` nor a bucket
  -- (note_absent); each is taken off at its first write
  local absent = {}
  local server = redis.server_call
  local byte, tonumber, unpack = string.byte, tonumber, unpack
  local part
  -- `pairs_` ({due, bucket, ...}) into `heads`, with ZADD's `flag` if given: one command (a
  -- chunk) for all the buckets a write changed, not one a bucket.
  local function set_heads(state, pairs_, flag)
    for i = 1, #pairs_, UNPACK_CHUNK do
      local last = math.min(i + UNPACK_CHUNK - 1, #pairs_)
      if flag then
        server('ZADD', state.heads, flag, unpack(pairs_, i, last))
      else
        server('ZADD', state.heads, unpack(pairs_, i, last))
      end
    end
  end
  -- Each of `buckets`'s entry in `heads` set to its first entry's due, or dropped once it is
  -- empty.
  local function refresh(store, state, buckets)
    local heads, emptied = {}, {}
    for _, b in ipairs(buckets) do
      local head = server('ZRANGE', part.bucket_key(store, b), 0, 0, 'WITHSCORES')
      if head[2] then
        heads[#heads + 1] = head[2]
        heads[#heads + 1] = b
      else
        emptied[#emptied + 1] = b
      end
    end
    set_heads(state, heads)
    for i = 1, #emptied, UNPACK_CHUNK do
      server('ZREM', state.heads, unpack(emptied, i, math.min(i + UNPACK_CHUNK - 1, #emptied)))
    end
  end
  part = bucketed_part(server, {
    flat = 'store', meta = 'storebuckets', field = 'redis_store_buckets',
    siblings = {'heads'},
    read_all = function(key) return server('ZRANGE', key, 0, -1, 'WITHSCORES') end,
    write = function(key, rows)  -- {id, due, ...}: ZADD takes {due, id, ...}
      local args = {}
      for i = 1, #rows, 2 do
        args[i], args[i + 1] = rows[i + 1], rows[i]
      end
      server('ZADD', key, unpack(args))
    end,
    remove = function(key, ids) return server('ZREM', key, unpack(ids)) end,
    changed = refresh,
  }, redis.hash_of)
  local state_of, hash_of, bucket_key = part.state_of, part.hash_of, part.bucket_key
  local wrapper

  local function begin_call()
    now = nil
    if next(after) then after = {} end
    if next(absent) then absent = {} end
    part.begin_call()
    wrapper.store_noted = part.noted
    redis.begin_call()
  end

  -- Whether `key` is a slot's `store` key (`dq:{<tag>}:store`), told by its bytes.
  local function is_store(key)
    local c1, c2, c3, c4, c5, c6 = byte(key, -6, -1)
    if c6 ~= 101 or c5 ~= 114 or c4 ~= 111 or c3 ~= 116 or c2 ~= 115 or c1 ~= 58 then
      return false  -- ':store'
    end
    local d1, d2, d3, d4 = byte(key, 1, 4)
    return d1 == 100 and d2 == 113 and d3 == 58 and d4 == 123  -- 'dq:{'
  end

  -- `msg` and `store` are a slot's keys; `records`, `stored`, `after_ms` its settings record's
  -- redis_record_buckets, redis_store_buckets and AFTER_FIELD (nil: none), as topic_settings
  -- read them.
  -- Both wrappers' tables are written in place (their `noted`, which the change tracking
  -- reads too): this runs once a slot a call visits.
  local function note_layout(msg, store, records, stored, after_ms)
    redis.noted[msg] = records or false
    part.noted[store] = stored or false
    after[store] = tonumber(after_ms) or 0
  end

  -- The first due that goes into a bucket when written now: now + the record's AFTER_FIELD;
  -- nil when that is 0 (every due goes into a bucket, even one past).
  local function bucketed_from(store)
    local after_ms = after[store]
    if not after_ms then
      after_ms = tonumber(server('HGET', settings_record(store), AFTER_FIELD)) or 0
      after[store] = after_ms
    end
    if after_ms == 0 then return nil end
    if not now then now = now_ms() end
    return now + after_ms
  end

  -- `ids` are in neither `store` nor a bucket of the slot of `store`, as the caller knows: a
  -- schedule found them without a record (a live message always has one; the create-only
  -- rule reads them anyway), or a retry, give-back or expired lease has just taken them out
  -- of `prepare` (a message is scheduled, prepared or dead, never two). Their first write
  -- here deletes no other copy. That write is what a message due soon cost most: a ZREM in
  -- its own bucket, once a message at depth (docs/benchmarks.md, "A new message due soon
  -- deletes nothing in its bucket"). Noted only where the slot's record has the field.
  local function note_absent(store, ids)
    if not part.noted[store] then return end
    local set = absent[store]
    if not set then
      set = {}
      absent[store] = set
    end
    for _, id in ipairs(ids) do set[id] = true end
  end

  -- The pairs of `args` ({due, id, ...}) whose id may have another copy to delete: all but
  -- the noted absent ids, each taken off the note here (a later write of it in this call
  -- has this one's copy to delete). nil when that is all of them.
  local function with_copies(store, args)
    local set = absent[store]
    if not set then return nil end
    local keep, skipped = {}, false
    for i = 2, #args, 2 do
      local id = args[i]
      if set[id] then
        set[id] = nil
        skipped = true
      else
        keep[#keep + 1] = args[i - 1]
        keep[#keep + 1] = id
      end
    end
    return skipped and keep or nil
  end

  local function unbucketed_slots(keys, first, step)
    redis.unbucketed_slots(keys, first, step)
    part.unbucketed_slots(keys, first, step)
  end

  -- ZADD of {due, id, ...} into `store`, deleting each id's bucket entry (not a noted absent
  -- one's: it has none): how many are new.
  local function into_store(store, state, args)
    local added = server('ZADD', store, unpack(args))
    state.legacy = true
    local copies = with_copies(store, args) or args
    if #copies == 0 then return added end
    return added - part.delete_from_buckets(store, state, copies, 2, 2)
  end

  -- ZADD of {due, id, ...} into the ids' buckets, deleting each id's `store` entry (not a
  -- noted absent one's): how many are new.
  local function into_buckets(store, state, args)
    local copies = with_copies(store, args)
    local groups, order = bucket_groups(args, 2, 2, state.n, hash_of)
    local added, ids, earlier, changed = 0, {}, {}, {}
    for _, b in ipairs(order) do
      local pairs_, earliest = {}, nil
      for _, i in ipairs(groups[b]) do
        pairs_[#pairs_ + 1] = args[i - 1]
        pairs_[#pairs_ + 1] = args[i]
        ids[#ids + 1] = args[i]
        local due = tonumber(args[i - 1])
        if not earliest or due < earliest[1] then earliest = {due, args[i - 1]} end
      end
      local new = server('ZADD', bucket_key(store, b), unpack(pairs_))
      if new == #pairs_ / 2 then  -- all new: the head can only move earlier
        earlier[#earlier + 1] = earliest[2]
        earlier[#earlier + 1] = b
      else
        changed[#changed + 1] = b
      end
      added = added + new
    end
    set_heads(state, earlier, 'LT')
    refresh(store, state, changed)
    local moved = 0
    if copies then
      ids = {}
      for i = 2, #copies, 2 do ids[#ids + 1] = copies[i] end
    end
    if state.legacy and #ids > 0 then moved = server('ZREM', store, unpack(ids)) end
    part.grow(store, state, added)
    return added - moved
  end

  -- ZADD store due id ...: into `store` while the slot does not write to buckets, else each
  -- entry into `store` when it is due before `bucketed_from`, into its bucket from then on. An
  -- id given twice is written once, with its last due, as one ZADD would keep it.
  local function zadd(store, state, args)
    if not tonumber(args[1]) then
      error({err = 'ERR store_buckets: ZADD flags are not served: ' .. tostring(args[1])})
    end
    local added = 0
    local from = state.to_buckets and bucketed_from(store)
    if not state.to_buckets then
      added = into_store(store, state, args)
    elseif not from then
      added = into_buckets(store, state, args)
    else
      local last = {}
      for i = 2, #args, 2 do last[args[i]] = i end
      local near, far = {}, {}
      for i = 2, #args, 2 do
        if last[args[i]] == i then
          local into = tonumber(args[i - 1]) < from and near or far
          into[#into + 1] = args[i - 1]
          into[#into + 1] = args[i]
        end
      end
      if #near > 0 then added = into_store(store, state, near) end
      if #far > 0 then added = added + into_buckets(store, state, far) end
    end
    part.settle(store, state)
    return added
  end

  -- ZREM store id ...: an id is in one place at most, so those `store` holds (one ZMSCORE
  -- tells, while it may hold any) are deleted there and only the others in their buckets: a
  -- claim of messages due soon touches no bucket.
  local function zrem(store, state, ids)
    if not state.legacy then return part.delete(store, state, ids) end
    local scores = server('ZMSCORE', store, unpack(ids))
    local kept, others = {}, {}
    for i, id in ipairs(ids) do
      local into = scores[i] and kept or others
      into[#into + 1] = id
    end
    local removed = 0
    if #kept > 0 then removed = server('ZREM', store, unpack(kept)) end
    if #others > 0 then
      removed = removed + part.delete_from_buckets(store, state, others, 1, 1)
    end
    part.settle(store, state)
    return removed
  end

  local function zcard(store, state)
    return state.count + (state.legacy and server('ZCARD', store) or 0)
  end

  -- ZCOUNT over the buckets whose head is due by `max` (no other holds an entry up to it), or
  -- over `buckets` when given (those).
  local function zcount(store, state, min, max, buckets)
    local count = state.legacy and server('ZCOUNT', store, min, max) or 0
    for _, b in ipairs(buckets or server('ZRANGEBYSCORE', state.heads, '-inf', max)) do
      count = count + server('ZCOUNT', bucket_key(store, b), min, max)
    end
    return count
  end

  -- ZCOUNT `key` min max for a figure a reader shows (stats-3's due, overview-4's windows),
  -- not for a decision: exact on a `store` kept whole and where at most SAMPLE buckets may
  -- hold entries in range; beyond, estimated from buckets 0 .. SAMPLE - 1, each a uniform
  -- sample of the slot's ids by their hash: their entries in range over all their entries,
  -- times all the buckets' entries (`store`'s own counted exactly). A range from -inf counts at
  -- least one entry a bucket whose head is in it. An exact count would read every bucket: 68
  -- ms a 16-slot overview at a million pending, ten times that at ten million.
  local SAMPLE = 32
  local function estimated_count(key, min, max)
    local state = is_store(key) and state_of(key, false)
    if not state then return server('ZCOUNT', key, min, max) end
    local in_range = server('ZRANGEBYSCORE', state.heads, '-inf', max, 'LIMIT', 0, SAMPLE + 1)
    if #in_range <= SAMPLE then return zcount(key, state, min, max, in_range) end
    local inside, seen = 0, 0
    for b = 0, math.min(SAMPLE, state.n) - 1 do
      local bucket = bucket_key(key, b)
      inside = inside + server('ZCOUNT', bucket, min, max)
      seen = seen + server('ZCARD', bucket)
    end
    local count = seen > 0 and math.floor(state.count * inside / seen + 0.5) or 0
    if min == '-inf' then count = math.max(count, #in_range) end
    return count + (state.legacy and server('ZCOUNT', key, min, max) or 0)
  end

  -- ZRANGE store 0 0 WITHSCORES: the earliest entry, of the earliest head and of `store`.
  local function zrange(store, state, start, stop, withscores)
    if start ~= 0 and start ~= '0' or stop ~= 0 and stop ~= '0' or withscores ~= 'WITHSCORES' then
      error({err = 'ERR store_buckets: only ZRANGE 0 0 WITHSCORES is served'})
    end
    local best = state.legacy and server('ZRANGE', store, 0, 0, 'WITHSCORES') or {}
    local head = server('ZRANGE', state.heads, 0, 0, 'WITHSCORES')
    if head[2] and (not best[2] or tonumber(head[2]) < tonumber(best[2])) then
      best = server('ZRANGE', bucket_key(store, head[1]), 0, 0, 'WITHSCORES')
    end
    return best
  end

  -- (score, bucket, id) order of range candidates {due, bucket name, id, score as read}.
  local function before(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    if a[2] ~= b[2] then return a[2] < b[2] end
    return a[3] < b[3]
  end

  -- ZRANGEBYSCORE store min max [WITHSCORES] LIMIT offset count (see the header).
  local function zrangebyscore(store, state, min, max, ...)
    local options = {...}
    local withscores, offset, count = false, nil, nil
    local i = 1
    while i <= #options do
      if options[i] == 'WITHSCORES' then
        withscores = true
        i = i + 1
      elseif options[i] == 'LIMIT' then
        offset, count = tonumber(options[i + 1]), tonumber(options[i + 2])
        i = i + 3
      else
        error({err = 'ERR store_buckets: ZRANGEBYSCORE option not served: ' .. options[i]})
      end
    end
    if not count or count < 0 then
      error({err = 'ERR store_buckets: ZRANGEBYSCORE is served with a LIMIT only'})
    end
    local need = offset + count
    local low = -math.huge
    if min ~= '-inf' then low = tonumber((string.gsub(min, '^%(', ''))) end
    local found = {}  -- unsorted while shorter than need, then sorted and need long
    local function take(name, flat)
      for k = 1, #flat, 2 do
        local entry = {tonumber(flat[k + 1]), name, flat[k], flat[k + 1]}
        if #found < need then
          found[#found + 1] = entry
          if #found == need then table.sort(found, before) end
        elseif before(entry, found[need]) then
          local at = need
          while at > 1 and before(entry, found[at - 1]) do
            found[at] = found[at - 1]
            at = at - 1
          end
          found[at] = entry
        end
      end
    end
    local function read(key, name)
      if need > 0 then
        take(name, server('ZRANGEBYSCORE', key, min, max, 'WITHSCORES', 'LIMIT', 0, need))
      end
    end
    if state.legacy then read(store, '') end
    local from, done = 0, need == 0
    while not done do
      local heads = server('ZRANGEBYSCORE', state.heads, '-inf', max, 'WITHSCORES', 'LIMIT',
        from, HEADS_PAGE)
      from = from + #heads / 2
      for k = 1, #heads, 2 do
        local name, head = heads[k], tonumber(heads[k + 1])
        local last = #found == need and found[need]
        if last and head > last[1] then
          done = true
          break
        end
        local bound = math.max(head, low)
        if not last or bound < last[1] or (bound == last[1] and name < last[2]) then
          read(bucket_key(store, name), name)
        elseif bound == head then  -- every later bucket comes after `last` as well
          done = true
          break
        end
      end
      if #heads < 2 * HEADS_PAGE then done = true end
    end
    if #found < need then table.sort(found, before) end
    local out = {}
    for k = offset + 1, math.min(#found, need) do
      out[#out + 1] = found[k][3]
      if withscores then out[#out + 1] = found[k][4] end
    end
    return out
  end

  local WRITES = {ZADD = true, ZREM = true}
  -- One of the commands the header names on a slot's `store` key (`is_store`).
  local function call(command, store, ...)
    local state = state_of(store, WRITES[command] ~= nil)
    if not state then return server(command, store, ...) end
    if command == 'ZSCORE' then return part.get('ZSCORE', store, state, (...)) end
    if command == 'ZADD' then return zadd(store, state, {...}) end
    if command == 'ZREM' then return zrem(store, state, {...}) end
    if command == 'ZMSCORE' then return part.get_many('ZMSCORE', store, state, {...}) end
    if command == 'ZCARD' then return zcard(store, state) end
    if command == 'ZCOUNT' then return zcount(store, state, ...) end
    if command == 'ZRANGE' then return zrange(store, state, ...) end
    if command == 'ZRANGEBYSCORE' then return zrangebyscore(store, state, ...) end
    error({err = 'ERR store_buckets: command not served on a store: ' .. command})
  end

  wrapper = setmetatable({store_call = call, is_store = is_store, store_noted = part.noted,
    estimated_count = estimated_count,
    begin_call = begin_call, unbucketed_slots = unbucketed_slots, note_layout = note_layout,
    note_absent = note_absent},
    {__index = redis})
  return wrapper
end
