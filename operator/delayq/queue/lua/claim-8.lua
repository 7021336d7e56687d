#!lua flags=allow-oom
--[[
  Claim due messages of one slot (two-phase consumption, phase one): store -> prepare with a lease.
  First rolls expired leases back (each expiry counts as a failed attempt; past max_retries the
  message goes to dead), then moves at most max_count messages whose due time has passed on the
  server clock — never one that is early. The batch bound keeps a burst of millions due at one
  instant from ever loading more than max_count messages into memory.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] epoch    STRING fencing epoch of the slot owner
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] leases   STRING the last lease number drawn in the slot (never repeats)

  ARGV[1] epoch           the caller's fencing epoch
  ARGV[2] max_count       at most this many messages claimed
  ARGV[3] lease_ms        lease length; the deadline is server now + lease_ms
  ARGV[4] max_retries     attempts beyond this are dead
  ARGV[5] journal_max_len  0 = journal off
  ARGV[6] rollback_max    at most this many expired leases rolled back in this call

  Returns {code, now_us, next_due_ms, next_deadline_ms, id1, record1, id2, record2, ...}
     0 OK           next_due_ms / next_deadline_ms are -1 when store / prepare is empty;
                    each record carries the incremented attempt count, the due time and
                    the lease number of this claim (the lease token's `lease`)
    -2 STALE_EPOCH  the caller is not the current owner: nothing was changed
                    now_us is the server clock in microseconds (due times are compared in whole
                    ms): consumers time their next wake-up from it without flooring error

  Runs under maxmemory (allow-oom): a claim moves messages between the slot's keys and grows
  nothing but the bounded journal, and a full Redis must keep delivering (acks free memory).

  Events: expired (lease rolled back), dead (attempts exhausted), claimed, orphan (an id with no
  record: removed so it can never block the slot)
]]
--@include call_chunked
--@include codes
--@include epoch_matches
--@include journal
--@include now_us
--@include read_chunked
--@include record_fields
--@include record_with

local store, prepare, dead, msg, reason, epoch_key, journal_key, leases_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local max_count = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local max_retries = tonumber(ARGV[4])
local journal_max_len = tonumber(ARGV[5])
local rollback_max = tonumber(ARGV[6])

if not epoch_matches(epoch_key, ARGV[1]) then
  return {CODE.STALE_EPOCH, 0, -1, -1}
end
local now_micros = now_us()
local now = math.floor(now_micros / 1000)

-- 1. Roll back expired leases.
local expired = redis.call('ZRANGEBYSCORE', prepare, '-inf', now, 'LIMIT', 0, rollback_max)
for _, id in ipairs(expired) do
  redis.call('ZREM', prepare, id)
  local record = redis.call('HGET', msg, id)
  if record then
    local attempts, due = record_fields(record)
    journal(journal_key, journal_max_len, 'expired', id, now, due, attempts)
    if attempts > max_retries then
      redis.call('ZADD', dead, now, id)
      redis.call('HSET', reason, id, 'lease expired on attempt ' .. attempts)
      journal(journal_key, journal_max_len, 'dead', id, now, due, attempts)
    else
      redis.call('HSET', msg, id, record_with(record, attempts, '', ''))
      redis.call('ZADD', store, now, id)
    end
  end
end

-- 2. Claim what is due.
local claimed = {CODE.OK, now_micros, -1, -1}
local due_ids = redis.call('ZRANGEBYSCORE', store, '-inf', now, 'WITHSCORES', 'LIMIT', 0, max_count)
if #due_ids > 0 then
  local deadline = now + lease_ms
  local lease = tostring(redis.call('INCR', leases_key))
  local ids, zadd_args, hset_args = {}, {}, {}
  for i = 1, #due_ids, 2 do ids[#ids + 1] = due_ids[i] end
  local records = read_chunked('HMGET', msg, ids)
  for k = 1, #ids do
    local id, due, record = ids[k], due_ids[2 * k], records[k]
    if record then
      local attempts, _, _, p3 = record_fields(record)
      attempts = attempts + 1
      local leased = record_with(record, attempts, due, lease, p3)
      zadd_args[#zadd_args + 1] = deadline
      zadd_args[#zadd_args + 1] = id
      hset_args[#hset_args + 1] = id
      hset_args[#hset_args + 1] = leased
      claimed[#claimed + 1] = id
      claimed[#claimed + 1] = leased
      journal(journal_key, journal_max_len, 'claimed', id, now, due, attempts)
    else
      journal(journal_key, journal_max_len, 'orphan', id, now, due, '')
    end
  end
  call_chunked('ZREM', store, ids)
  if #zadd_args > 0 then
    call_chunked('ZADD', prepare, zadd_args)
    call_chunked('HSET', msg, hset_args)
  end
end

local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
if head[2] then claimed[3] = tonumber(head[2]) end
local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
if lease_head[2] then claimed[4] = tonumber(lease_head[2]) end
return claimed
