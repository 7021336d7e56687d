#!lua flags=allow-oom
--[[
  Extend leases (a consumer's heartbeat): the new deadline is server now + lease_ms.

  KEYS[1] prepare  ZSET id -> lease deadline ms
  KEYS[2] msg      HASH id -> record
  KEYS[3] epoch    STRING fencing epoch of the slot owner

  ARGV[1] epoch     the caller's fencing epoch
  ARGV[2] lease_ms  new lease length from now
  ARGV[3 + 2k], ARGV[4 + 2k]  per message: id, lease

  Returns, flat, per message: code, deadline_ms
    10 EXTENDED     leased until deadline_ms
    -2 STALE_EPOCH  the caller is not the current owner: nothing was changed (whole call)
    -3 LEASE_LOST   not leased under that lease any more, or its deadline has passed: an
                    expired lease is never revived, even before anyone reclaims the message
                    (a heartbeat held up past the deadline must not extend what the caller
                    has already stopped delivering)

  Runs under maxmemory (allow-oom): it only moves a deadline.

  Events: none (a heartbeat is not a lifecycle transition)
]]
--@include append
--@include codes
--@include epoch_matches
--@include leased_record
--@include now_ms

local prepare, msg, epoch_key = KEYS[1], KEYS[2], KEYS[3]
local results = {}
if not epoch_matches(epoch_key, ARGV[1]) then
  for i = 3, #ARGV, 2 do append(results, CODE.STALE_EPOCH, 0) end
  return results
end
local now = now_ms()
local deadline = now + tonumber(ARGV[2])

for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local record, lease_deadline = leased_record(prepare, msg, id, ARGV[i + 1])
  if record and lease_deadline > now then
    redis.call('ZADD', prepare, 'XX', deadline, id)
    append(results, CODE.EXTENDED, deadline)
  else
    append(results, CODE.LEASE_LOST, 0)
  end
end
return results
