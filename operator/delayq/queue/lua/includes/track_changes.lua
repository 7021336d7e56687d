-- Every script's first helper (queue/scripts.py puts it before the others): a `redis` that
-- shadows the server's, so each write below goes through it. While a doubling copies a slot
-- before freezing it (coordination/splitting.py), the slot's `changes` set exists (holding ''
-- at least), and every message or schedule a ZADD, ZREM, HSET or HDEL touches in a part the
-- doubling divides is added to it ('m<id>' or 's<schedule id>'): the catch-up under the freeze
-- copies exactly those again. The scripts change those parts with these four commands only
-- (tests/queue/test_scripts.py checks it). Whether a slot is tracked is looked up once per
-- script call: this helper must run inside each call (inlined into the script's body, never at
-- a function library's top level, where its memo would outlive the call and miss a tracking
-- turned on later). Cost: one EXISTS per script call that writes those parts.
--@include unpack_chunk

local redis = (function()
  local SIDES = {
    store = 'm', prepare = 'm', dead = 'm', msg = 'm', reason = 'm', outcome = 'm',
    finished = 'm', basis = 'm', schedules = 's', topup = 's',
  }
  local ZADD_FLAGS = {NX = true, XX = true, GT = true, LT = true, CH = true, INCR = true}
  local FIRST_MEMBER = {ZREM = 2, HDEL = 2, HSET = 2, ZADD = 3}  -- in {key, ...}
  local STRIDE = {ZREM = 1, HDEL = 1, HSET = 2, ZADD = 2}
  local tracked = {}  -- changes key -> whether it exists, for this call of the script
  local function changes_of(key)
    local tag, part = string.match(key, '^(dq:{.*}):(%a+)$')
    local side = part and SIDES[part]
    if not side then return nil end
    local changes = tag .. ':changes'
    if tracked[changes] == nil then tracked[changes] = redis.call('EXISTS', changes) == 1 end
    if tracked[changes] then return changes, side end
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
end)()
