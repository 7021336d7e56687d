#!lua flags=allow-oom,allow-cross-slot-keys
--[[
  Claim due messages of several slots of one broker in one call: claim-13 run slot after slot
  (claim_slot), so a consumer's wake-up over many due slots costs one call per broker, not one
  per slot. Every slot is fenced by its own epoch: a slot whose epoch is not the caller's answers
  STALE_EPOCH and nothing of it changes, and the call goes on with the others. What every slot
  would ask alone is asked once for all of them (their epochs, whether any has schedules or owes
  a top-up, whether any is tracked for a doubling), as in schedulemany-1. Standalone brokers
  only, as schedulemany-1 (docs/contracts.md §1). Runs under maxmemory (allow-oom), as claim-13;
  claim-13's byte bound holds for the whole call (its slots share one budget).

  KEYS[1] store    ZSET id -> due ms of the first slot, then one per further slot (slot s, from
                   0: KEYS[s + 1]); its other parts are claim-13's KEYS[2 .. 13] (prepare,
                   dead, msg, reason, epoch, journal, leases, outcome, finished, schedules,
                   topup, basis), named `dq:{<tag>}:<part>` after it (slot_prefix), as
                   schedulemany-1 names a slot's parts: thirteen declared keys a slot were most
                   of a call's bytes when each due slot held a message or two (a burst over
                   1,024 slots), for Python to build and pack, Redis to parse, check against the
                   caller's ACL key patterns and hand to Lua
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV             per slot, in the order of its keys: the number n of its arguments, then
                   its n arguments, claim-13's ARGV[1 .. n] (epoch, max_count, lease_ms, ...)

  Returns, per slot in order, the number m of messages it claimed, then claim-13's reply of
  that slot (its 5-value head, then m pairs id, record): 0 OK or -2 STALE_EPOCH per slot.
  A key that is not a slot's store key is refused (an error) before anything is written.

  Events: as claim-13's
]]
--@include claim_max_bytes
--@include claim_slot
--@include now_us
--@include slot_part_keys
--@include slots_header

-- claim-13's KEYS order
local PARTS = {'store', 'prepare', 'dead', 'msg', 'reason', 'epoch', 'journal', 'leases',
  'outcome', 'finished', 'schedules', 'topup', 'basis'}

local prefixes, _, epochs, absent = slots_header(KEYS, {'schedules', 'topup'})

local reply = {}
local now_micros = now_us()
local first = 1
local budget = {left = CLAIM_MAX_BYTES}  -- one byte budget for the whole call (claim_slot)
for s = 1, #KEYS do
  local keys = slot_part_keys(prefixes[s], PARTS)
  local count = tonumber(ARGV[first])
  local known = {epoch = epochs[s], series_absent = absent.schedules,
    topups_absent = absent.topup, budget = budget}
  local args = {unpack(ARGV, first + 1, first + count)}
  local claimed = claim_slot(keys, 0, args, now_micros, known)
  first = first + count + 1
  reply[#reply + 1] = (#claimed - 5) / 2
  for i = 1, #claimed do reply[#reply + 1] = claimed[i] end
end
return reply
