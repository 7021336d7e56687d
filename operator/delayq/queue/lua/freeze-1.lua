#!lua flags=allow-oom
--[[
  Freeze a slot for a move to another broker (queue/migration.py): its epoch becomes
  'moving:<epoch>'. From this call on every claim, ack, nack, extend and give-back of the old
  owner is refused as stale (no epoch equals it), its fence-10 and every producing write
  (schedule, cancel, reschedule, redrive, purge, define, drop, topup) raise SLOT_MOVING, so
  nothing changes in the slot on this broker while it is copied; so does a read by id (get),
  since the source is emptied after the move. Idempotent: a frozen slot
  stays as it is, so a mover that crashed may freeze again.

  KEYS[1] epoch  STRING fencing epoch of the slot owner

  ARGV: none

  Returns the epoch that was frozen (an integer, 0 when the slot never had an owner).

  Runs under maxmemory (allow-oom): one small string, and a full broker must still let its
  slots move away.

  Events: none
]]

local current = redis.call('GET', KEYS[1]) or '0'
if string.sub(current, 1, 7) == 'moving:' then
  return tonumber(string.sub(current, 8))
end
redis.call('SET', KEYS[1], 'moving:' .. current)
return tonumber(current)
