-- Shared helpers, inlined by the Python loader where a script says `--@include common`.
--
-- Record layout (the value of a message in the slot's `msg` hash):
--   "<attempts>:<due_ms or empty>:<lease or empty>:<headers_len>:" .. headers .. payload
-- `due` is empty while the message waits in `store` (its due time is the store score) and holds
-- the due time it was delivered for while it is leased, so lateness can be reported. `lease` is
-- empty unless leased; then it holds the number the claim drew from the slot's `leases`
-- counter, which never repeats in a slot: a lease token names exactly one lease, so a stale
-- token can never ack, nack or extend a later lease of the same id (after an upsert, redrive,
-- or an ack and a new schedule of the same id, `attempts` starts again but `lease` does not).

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

-- attempts (number), due (string, maybe empty), lease (string, maybe empty), and the offset
-- of the ':' that ends the lease field
local function record_fields(record)
  local p1 = string.find(record, ':', 1, true)
  local p2 = string.find(record, ':', p1 + 1, true)
  local p3 = string.find(record, ':', p2 + 1, true)
  return tonumber(string.sub(record, 1, p1 - 1)), string.sub(record, p1 + 1, p2 - 1),
    string.sub(record, p2 + 1, p3 - 1), p3
end

-- The record with new attempts, due and lease fields; `p3` (from record_fields) saves a parse.
local function record_with(record, attempts, due, lease, p3)
  if p3 == nil then p3 = select(4, record_fields(record)) end
  return tostring(attempts) .. ':' .. due .. ':' .. lease .. string.sub(record, p3)
end

-- The record of a leased message, when `lease` (the token's lease number, a string) is the
-- lease it holds now; false otherwise (acked, rolled back, given back, rescheduled, replaced).
local function leased_record(prepare, msg, id, lease)
  local record = redis.call('ZSCORE', prepare, id) and redis.call('HGET', msg, id)
  if record and select(3, record_fields(record)) == lease then return record end
  return false
end

local function new_record(headers, payload)
  return '0:::' .. tostring(#headers) .. ':' .. headers .. payload
end

local function journal(key, maxlen, event, id, now, due, attempts)
  if maxlen > 0 then
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
      'e', event, 'id', id, 't', now, 'due', due, 'a', attempts)
  end
end

-- Wake the slot's consumer when `due` is (one of) the earliest due times in the store.
-- The wake list holds at most one element, so a burst of schedules costs one push.
local function wake_if_earliest(store, wake, due)
  local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
  if head[2] ~= nil and tonumber(head[2]) >= due and redis.call('LLEN', wake) == 0 then
    redis.call('RPUSH', wake, '1')
  end
end

-- The fencing check: only the slot's current owner (epoch set by fence-1) may move its messages.
local function epoch_matches(epoch_key, epoch)
  local current = redis.call('GET', epoch_key)
  return current ~= false and current == epoch
end

-- Variadic commands in chunks, so a large batch never exceeds Lua's unpack limit.
local UNPACK_CHUNK = 1000
local function call_chunked(command, key, args)
  for i = 1, #args, UNPACK_CHUNK do
    redis.call(command, key, unpack(args, i, math.min(i + UNPACK_CHUNK - 1, #args)))
  end
end

-- A multi-key read (HMGET, ZMSCORE) over many members in chunks, as one flat list in order:
-- one Redis call per chunk instead of one per message keeps the hot scripts' cost in C.
local function read_chunked(command, key, members)
  local out = {}
  for i = 1, #members, UNPACK_CHUNK do
    local part = redis.call(command, key, unpack(members, i, math.min(i + UNPACK_CHUNK - 1, #members)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

-- Where a message is: 'scheduled' | 'prepared' | 'dead' | false, with its score there.
local function locate(store, prepare, dead, id)
  local score = redis.call('ZSCORE', store, id)
  if score then return 'scheduled', tonumber(score) end
  score = redis.call('ZSCORE', prepare, id)
  if score then return 'prepared', tonumber(score) end
  score = redis.call('ZSCORE', dead, id)
  if score then return 'dead', tonumber(score) end
  return false, nil
end

-- The ids a dead-letter call works on: ARGV[2] 'oldest' takes up to ARGV[3] of the oldest dead,
-- 'ids' takes ARGV[4..] as given (redrive-6 and purge-4 share this argument layout).
local function dead_batch_ids(dead)
  if ARGV[2] == 'oldest' then
    return redis.call('ZRANGE', dead, 0, tonumber(ARGV[3]) - 1)
  end
  local ids = {}
  for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end
