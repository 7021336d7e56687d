--@include existing_count
--@include bucket_groups
--@include bucket_of
--@include id_hash
--@include settings_record

-- What the two bucketed parts of a slot share (record_buckets: the records, `msg`;
-- store_buckets: the waiting messages' dues, `store`; docs/contracts.md §1): a slot keeps the
-- part in its one flat key `dq:{<tag>}:<flat>`, or in buckets `<flat key>:<b>`, b in 0 .. n - 1,
-- each small enough that Redis keeps it one listpack. The slot's meta hash
-- `dq:{<tag>}:<meta>` ({n, count}: how many buckets, how many entries they hold) exists while
-- any bucket may hold an entry; then reads look in the buckets and in the flat key. Writes go
-- where the slot's settings record says (its field `kind.field`, which the topic's owner
-- publishes as True only once every functions library on the broker reads such buckets): into
-- the bucket or into the flat key, and each deletes the entry's other copy, so an id is in one
-- place at most. Nothing is moved in bulk: entries move as they are written, and a slot whose
-- buckets empty while it writes to the flat key drops its meta hash (and `kind.siblings`).
--
-- The buckets grow one at a time (linear hashing: bucket_of), so none holds more than about
-- twice LOAD: when the entries pass LOAD a bucket, bucket n - 2^L is split, its entries whose
-- h mod 2^(L+1) is n moving to the new bucket n (a bucket past Redis's listpack limit is
-- written anew, as Redis converts it back only when it is recreated). Buckets never merge;
-- Redis deletes an emptied one. An entry only moves to a higher bucket, so a reader that scans
-- the buckets in order while the slot grows sees each one at least once
-- (queue/record_buckets.py). h is `id_hash`.
--
-- This is the part's state in one call; the commands of the part's type are its wrapper's.
-- `server` is the server's call. `kind` = {flat, meta, field, siblings (part names dropped with
-- the meta hash), read_all(key) -> {id, value, ...}, write(key, {id, value, ...}),
-- remove(key, ids) -> how many were there, changed(flat, state, buckets) (after those
-- buckets lost or gained entries, once a write; may be nil)}. `hash_of`, when given, is another
-- part's id_hash of this call's ids (record_buckets's, for store_buckets): a script names the
-- same ids to both, and the part that owns the hashes forgets them at its begin_call.
local function bucketed_part(server, kind, hash_of)
  local LOAD = 48  -- entries a bucket holds on average
  local LISTPACK_ENTRIES = 128  -- Redis's hash- and zset-max-listpack-entries
  local sub, tonumber, unpack = string.sub, tonumber, unpack
  local cut = -(#kind.flat + 1)  -- the flat key's prefix `dq:{<tag>}:` ends there
  local part = {}
  local slots = {}  -- flat key -> its state in this call (see state_of)
  local hashes = {}  -- id -> id_hash, for this call: a script reads and then writes the same ids
  -- the keys of a call over many slots (`unbucketed_slots`: keys, first, step), asked about
  -- at the first of its slots whose record has the field: one EXISTS of all their meta hashes
  local candidates = nil
  -- flat key -> the slot record's field, read in this call, or false when the record has none:
  -- then the slot's part is in its flat key alone (state_of), and the change tracking, which
  -- reads this table through the wrapper, sends the key's commands straight to the server.
  -- A new table each call (begin_call): the wrapper hands the new one on.
  part.noted = {}

  function part.begin_call()
    candidates = nil
    if next(slots) then slots = {} end
    if not hash_of and next(hashes) then hashes = {} end
    if next(part.noted) then part.noted = {} end
  end

  part.hash_of = hash_of or function(id)
    local h = hashes[id]
    if not h then
      h = id_hash(id)
      hashes[id] = h
    end
    return h
  end

  function part.bucket_key(flat, b)
    return flat .. ':' .. b
  end

  -- The slot's settings record's field: as topic_settings read it in this call (written into
  -- `noted` by store_buckets's `note_layout`), else asked here; false when the record has none.
  local function recorded(flat)
    local value = part.noted[flat]
    if value == nil then
      value = server('HGET', settings_record(flat), kind.field) or false
      part.noted[flat] = value
    end
    return value
  end

  -- When none of the candidates has a meta hash, each is 'unasked' for the rest of the call.
  local function ask_candidates()
    local keys, first, step = unpack(candidates)
    candidates = nil
    local names, flats = {}, {}
    for i = first, #keys, step do
      local prefix = string.match(keys[i], '^(dq:{.*}:)%a+$')
      names[#names + 1] = prefix .. kind.meta
      flats[#flats + 1] = prefix .. kind.flat
    end
    if existing_count(names) > 0 then return end
    for _, flat in ipairs(flats) do
      if slots[flat] == nil then slots[flat] = 'unasked' end
    end
  end

  local function new_state(flat, n, count)
    local prefix = sub(flat, 1, cut)
    local state = {meta = prefix .. kind.meta, n = n, count = count,
      legacy = server('EXISTS', flat) == 1}
    for _, name in ipairs(kind.siblings) do state[name] = prefix .. name end
    return state
  end

  -- The slot's state in this call: 'unasked' while it has no meta hash (its record not asked
  -- yet: only a write asks), false when it has none and its record wants none, else
  -- {meta, n, count, legacy (the flat key may hold entries), to_buckets (asked by the first
  -- write), and a key a sibling}. Returns false for the first two: the slot's part is in its
  -- flat key alone. A slot whose settings record lacks the field has no meta hash (the owner
  -- writes the field once the topic turns buckets on and keeps it from then on, publish-1; a
  -- slot's copy onto a broker whose record lacks it brings its entries into the flat key,
  -- queue/slot_copy.py): its meta hash is not asked for, so topics that never had buckets pay
  -- one HMGET field (of a read the call makes anyway, topic_settings) and no lookup a slot.
  function part.state_of(flat, writing)
    local state = slots[flat]
    if state == nil then
      state = 'unasked'
      if recorded(flat) then
        if candidates then ask_candidates() end
        if slots[flat] == nil then
          local n, count = unpack(server('HMGET', sub(flat, 1, cut) .. kind.meta, 'n', 'count'))
          if n then state = new_state(flat, tonumber(n), tonumber(count)) end
        end
      end
      slots[flat] = state
    end
    if writing and state == 'unasked' then
      state = false
      if recorded(flat) == 'True' then
        state = new_state(flat, 1, 0)
        state.to_buckets = true
        server('HSET', state.meta, 'n', state.n, 'count', state.count)
      end
      slots[flat] = state
    elseif writing and state and state.to_buckets == nil then
      state.to_buckets = recorded(flat) == 'True'
    end
    return state ~= 'unasked' and state
  end

  -- `keys[first]`, `keys[first + step]`, ... name one key of each slot of a call over many
  -- slots (schedulemany-1, claimmany-1, ackmany-1): when none of them has a meta hash (one
  -- EXISTS for all, made once a slot's record has the field: state_of), their reads skip the
  -- lookup for the rest of the call.
  function part.unbucketed_slots(keys, first, step)
    candidates = {keys, first, step}
  end

  -- args[i], args[i + 1], ..., args[i + width - 1] for each i of `positions`, in one list.
  function part.gathered(args, positions, width)
    local out = {}
    for _, i in ipairs(positions) do
      for k = 0, width - 1 do out[#out + 1] = args[i + k] end
    end
    return out
  end
  local gathered = part.gathered

  -- Delete the ids at positions first, first + stride, ... of `args` from their buckets;
  -- returns how many were there.
  function part.delete_from_buckets(flat, state, args, first, stride)
    local groups, order = bucket_groups(args, first, stride, state.n, part.hash_of)
    local removed, changed = 0, {}
    for _, b in ipairs(order) do
      local gone = kind.remove(part.bucket_key(flat, b), gathered(args, groups[b], 1))
      if gone > 0 then
        changed[#changed + 1] = b
        removed = removed + gone
      end
    end
    if kind.changed and #changed > 0 then kind.changed(flat, state, changed) end
    state.count = state.count - removed
    return removed
  end

  -- The value of `id` (its command the part's HGET or ZSCORE): in its bucket, else in the flat
  -- key while that may hold entries.
  function part.get(command, flat, state, id)
    local got = server(command, part.bucket_key(flat, bucket_of(part.hash_of(id), state.n)), id)
    if not got and state.legacy then got = server(command, flat, id) end
    return got
  end

  -- The values of `ids` (its command the part's HMGET or ZMSCORE), false where none: one read a
  -- bucket they fall in, then one of the flat key for those not found, while it may hold any.
  function part.get_many(command, flat, state, ids)
    local out = {}
    for i = 1, #ids do out[i] = false end
    local groups, order = bucket_groups(ids, 1, 1, state.n, part.hash_of)
    for _, b in ipairs(order) do
      local positions = groups[b]
      local got = server(command, part.bucket_key(flat, b), unpack(gathered(ids, positions, 1)))
      for k, i in ipairs(positions) do out[i] = got[k] end
    end
    if state.legacy then
      local missing = {}
      for i = 1, #ids do
        if not out[i] then missing[#missing + 1] = i end
      end
      if #missing > 0 then
        local got = server(command, flat, unpack(gathered(ids, missing, 1)))
        for k, i in ipairs(missing) do out[i] = got[k] end
      end
    end
    return out
  end

  local function split(flat, state)
    local n = state.n
    local low = 1
    while low * 2 <= n do low = low * 2 end
    local from = n - low
    local key = part.bucket_key(flat, from)
    local rows = kind.read_all(key)
    local kept, moved, gone = {}, {}, {}
    for i = 1, #rows, 2 do
      local into = part.hash_of(rows[i]) % (low * 2) == n and moved or kept
      into[#into + 1] = rows[i]
      into[#into + 1] = rows[i + 1]
      if into == moved then gone[#gone + 1] = rows[i] end
    end
    if #moved > 0 then
      kind.write(part.bucket_key(flat, n), moved)
      if #rows / 2 > LISTPACK_ENTRIES then  -- no listpack: recreated, one again
        server('DEL', key)
        if #kept > 0 then kind.write(key, kept) end
      else
        kind.remove(key, gone)
      end
      if kind.changed then kind.changed(flat, state, {from, n}) end
    end
    state.n = n + 1
  end

  -- After `added` entries went into the buckets: the buckets split while they hold more than
  -- LOAD each on average.
  function part.grow(flat, state, added)
    state.count = state.count + added
    while state.count > state.n * LOAD do split(flat, state) end
  end

  -- Delete `ids` wherever they are (a write's HDEL or ZREM); returns how many were there.
  function part.delete(flat, state, ids)
    local removed = part.delete_from_buckets(flat, state, ids, 1, 1)
    if state.legacy then removed = removed + kind.remove(flat, ids) end
    part.settle(flat, state)
    return removed
  end

  -- After a write: the count kept, or the meta hash (and the siblings) dropped once the
  -- buckets are empty and the slot writes to its flat key (its reads then look nowhere
  -- else). Empty is asked of the buckets themselves, not only of the count: an entry dropped
  -- from sight would be lost.
  function part.settle(flat, state)
    if state.count == 0 and not state.to_buckets then
      local buckets = {}
      for b = 0, state.n - 1 do buckets[#buckets + 1] = part.bucket_key(flat, b) end
      if existing_count(buckets) == 0 then
        local dropped = {state.meta}
        for _, name in ipairs(kind.siblings) do dropped[#dropped + 1] = state[name] end
        server('DEL', unpack(dropped))
        slots[flat] = false
        return
      end
    end
    server('HSET', state.meta, 'n', state.n, 'count', state.count)
  end

  return part
end
