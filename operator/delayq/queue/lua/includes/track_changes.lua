-- `redis` as every script sees it (queue/scripts.py binds
-- `local redis = track_changes(store_buckets(record_buckets(redis)))` before the script's other
-- helpers, so theirs are tracked too): store_buckets's, which reaches the server's, but its ZADD,
-- ZREM, HSET and HDEL on a part a doubling divides note what they touch. While a doubling
-- copies a slot before freezing it (coordination/splitting.py), the slot's `changes` set exists
-- (holding '' at least), and each message or schedule such a write touches is added to it
-- ('m<id>' or 's<schedule id>'): the catch-up under the freeze copies exactly those again. The
-- scripts change those parts with these four commands only (tests/queue/test_scripts.py checks
-- it). Whether the slot is tracked is looked up at every such write, unless the call asked
-- once for all its slots (`untracked_slots`): a call over hundreds of slots (schedulemany-1,
-- claimmany-1) would pay one EXISTS a slot and write. That answer lasts for the call only:
-- the wrapper may be made once for many calls (a functions library), and every function's first
-- line (`begin_call`, functions.py) forgets it; no script creates a `changes` set, so it cannot
-- turn wrong within the call.
--@include existing_count
--@include unpack_chunk

local function track_changes(redis)
  local SIDES = {
    store = 'm', prepare = 'm', dead = 'm', msg = 'm', reason = 'm', outcome = 'm',
    finished = 'm', basis = 'm', priority = 'm', schedules = 's', topup = 's',
  }
  local ZADD_FLAGS = {NX = true, XX = true, GT = true, LT = true, CH = true, INCR = true}
  local FIRST_MEMBER = {ZREM = 2, HDEL = 2, HSET = 2, ZADD = 3}  -- in {key, ...}
  local STRIDE = {ZREM = 1, HDEL = 1, HSET = 2, ZADD = 2}
  local untracked = {}  -- `changes` key -> true: absent, asked by untracked_slots in this call
  local function changes_of(key)
    local tag, part = string.match(key, '^(dq:{.*}):(%a+)$')
    local side = part and SIDES[part]
    if not side then return nil end
    local changes = tag .. ':changes'
    if not untracked[changes] and redis.call('EXISTS', changes) == 1 then return changes, side end
  end
  -- `keys[first]`, `keys[first + step]`, ... name one key of each slot of the call: when none of
  -- those slots is tracked (one EXISTS for all), their writes skip the lookup for the
  -- rest of the call. When one is, every write still looks its own slot up.
  local function untracked_slots(keys, first, step)
    local names = {}
    for i = first, #keys, step do
      names[#names + 1] = string.match(keys[i], '^(dq:{.*}):%a+$') .. ':changes'
    end
    if existing_count(names) > 0 then return end
    for _, changes in ipairs(names) do untracked[changes] = true end
  end
  -- `msg` key -> false when the slot's records are in `msg` alone, as record_buckets noted;
  -- `store` key -> false when its messages wait in `store` alone, as store_buckets noted
  local noted, store_noted = redis.noted, redis.store_noted
  local function begin_call()
    if next(untracked) then untracked = {} end
    redis.begin_call()
    noted, store_noted = redis.noted, redis.store_noted
  end
  local function note(command, changes, side, args)
    local first = FIRST_MEMBER[command]
    if command == 'ZADD' then
      while ZADD_FLAGS[args[first - 1]] do first = first + 1 end
    end
    local members = {}
    for i = first, #args, STRIDE[command] do members[#members + 1] = side .. args[i] end
    for i = 1, #members, UNPACK_CHUNK do
      redis.call('SADD', changes, unpack(members, i, math.min(i + UNPACK_CHUNK - 1, #members)))
    end
  end
  -- a command on a slot's records goes to record_buckets, one on its `store` to
  -- store_buckets (each finds them where they are kept); every other one straight to the
  -- server's call
  local RECORD_COMMANDS = {HGET = true, HMGET = true, HSET = true, HDEL = true}
  local STORE_COMMANDS = {ZADD = true, ZREM = true, ZSCORE = true, ZMSCORE = true, ZCARD = true,
    ZCOUNT = true, ZRANGE = true, ZRANGEBYSCORE = true}
  local records_call, is_records = redis.call, redis.is_records
  local store_call, is_store = redis.store_call, redis.is_store
  local server_call = redis.server_call
  local function call(command, ...)
    if FIRST_MEMBER[command] then
      local changes, side = changes_of((...))
      if changes then note(command, changes, side, {...}) end
    end
    if RECORD_COMMANDS[command] then
      local key = (...)
      if noted[key] ~= false and is_records(key) then return records_call(command, ...) end
    elseif STORE_COMMANDS[command] then
      local key = (...)
      if store_noted[key] ~= false and is_store(key) then return store_call(command, ...) end
    end
    return server_call(command, ...)
  end
  return setmetatable({call = call, untracked_slots = untracked_slots, begin_call = begin_call},
    {__index = redis})
end
