-- `redis` as every script sees it (queue/scripts.py binds `local redis = track_changes(redis)`
-- before the script's other helpers, so theirs are tracked too): the server's, but its ZADD,
-- ZREM, HSET and HDEL on a part a doubling divides note what they touch. While a doubling
-- copies a slot before freezing it (coordination/splitting.py), the slot's `changes` set exists
-- (holding '' at least), and each message or schedule such a write touches is added to it
-- ('m<id>' or 's<schedule id>'): the catch-up under the freeze copies exactly those again. The
-- scripts change those parts with these four commands only (tests/queue/test_scripts.py checks
-- it). Whether the slot is tracked is looked up at every such write, never remembered: the
-- wrapper may be made once for many calls (a functions library), and a memo would outlive the
-- call that made it.
--@include unpack_chunk

local function track_changes(redis)
  local SIDES = {
    store = 'm', prepare = 'm', dead = 'm', msg = 'm', reason = 'm', outcome = 'm',
    finished = 'm', basis = 'm', schedules = 's', topup = 's',
  }
  local ZADD_FLAGS = {NX = true, XX = true, GT = true, LT = true, CH = true, INCR = true}
  local FIRST_MEMBER = {ZREM = 2, HDEL = 2, HSET = 2, ZADD = 3}  -- in {key, ...}
  local STRIDE = {ZREM = 1, HDEL = 1, HSET = 2, ZADD = 2}
  local function changes_of(key)
    local tag, part = string.match(key, '^(dq:{.*}):(%a+)$')
    local side = part and SIDES[part]
    if not side then return nil end
    local changes = tag .. ':changes'
    if redis.call('EXISTS', changes) == 1 then return changes, side end
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
  local function call(command, ...)
    if FIRST_MEMBER[command] then
      local changes, side = changes_of((...))
      if changes then note(command, changes, side, {...}) end
    end
    return redis.call(command, ...)
  end
  return setmetatable({call = call}, {__index = redis})
end
