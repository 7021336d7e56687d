--@include bucketed_part
--@include bucket_groups
--@include compacted_record
--@include expanded_record

-- What store_buckets wraps (queue/scripts.py binds
-- `local redis = track_changes(store_buckets(record_buckets(redis)))`): the server's `redis`,
-- but its `call`, which track_changes sends HGET, HMGET, HSET and HDEL on a slot's `msg` key to
-- (`is_records`), reaches the slot's records wherever they are kept, so that no script names
-- where (docs/contracts.md §1, "Records in buckets").
--
-- A slot's records are in its `msg` hash, or in buckets: the hashes `<msg key>:<b>` (≈ 63 B a
-- record of a 40-byte payload, where the one large `msg` hash costs ≈ 123), by the settings
-- record's `redis_record_buckets` (the topic's recordBuckets), with the slot's `buckets` hash
-- ({n, count}) beside them. Where a record is kept, how the buckets grow and how the slot goes
-- back to `msg` alone is what both bucketed parts share: bucketed_part. A read looks in the
-- record's bucket and then in `msg`. A bucket keeps a record just scheduled 5 bytes shorter
-- (compacted_record), and every read answers it whole (expanded_record).
local function record_buckets(redis)
  local server = redis.call
  local byte = string.byte
  local part = bucketed_part(server, {
    flat = 'msg', meta = 'buckets', field = 'redis_record_buckets', siblings = {},
    read_all = function(key) return server('HGETALL', key) end,
    write = function(key, rows) server('HSET', key, unpack(rows)) end,
    remove = function(key, ids) return server('HDEL', key, unpack(ids)) end,
  })
  local state_of, hash_of, gathered, bucket_key = part.state_of, part.hash_of, part.gathered,
    part.bucket_key
  local wrapper

  local function begin_call()
    part.begin_call()
    wrapper.noted = part.noted
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
        added = added + server('HSET', bucket_key(msg, b), unpack(gathered(args, groups[b], 2)))
      end
      if state.legacy then server('HDEL', msg, unpack(ids_of(args))) end
      part.grow(msg, state, added)
    else
      added = server('HSET', msg, unpack(args))
      state.legacy = true
      part.delete_from_buckets(msg, state, args, 1, 2)
    end
    part.settle(msg, state)
    return added
  end

  -- Whether `key` is a slot's `msg` key (`dq:{<tag>}:msg`), told by its bytes: no string is
  -- made for it, since the change tracking asks it of every HGET, HMGET, HSET and HDEL.
  local function is_records(key)
    local c1, c2, c3, c4 = byte(key, -4, -1)
    if c4 ~= 103 or c3 ~= 115 or c2 ~= 109 or c1 ~= 58 then return false end  -- ':msg'
    local d1, d2, d3, d4 = byte(key, 1, 4)
    return d1 == 100 and d2 == 113 and d3 == 58 and d4 == 123  -- 'dq:{'
  end

  local WRITES = {HSET = hset, HDEL = part.delete}
  -- HGET, HMGET, HSET or HDEL on a slot's `msg` key (`is_records`).
  local function call(command, msg, ...)
    local write = WRITES[command]
    local state = state_of(msg, write ~= nil)
    if not state then return server(command, msg, ...) end
    -- a record read is expanded wherever it was found: one of `msg` never begins with '.'
    if command == 'HGET' then return expanded_record(part.get('HGET', msg, state, (...))) end
    if write then return write(msg, state, {...}) end
    local got = part.get_many('HMGET', msg, state, {...})
    for i = 1, #got do got[i] = expanded_record(got[i]) end
    return got
  end

  wrapper = setmetatable({call = call, is_records = is_records, server_call = server,
    begin_call = begin_call, noted = part.noted, hash_of = part.hash_of,
    unbucketed_slots = part.unbucketed_slots},
    {__index = redis})
  return wrapper
end
