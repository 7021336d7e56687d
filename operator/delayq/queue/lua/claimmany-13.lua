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

  KEYS[1] store    ZSET id -> due ms           of the first slot, then again per further slot
  KEYS[2] prepare  ZSET id -> lease deadline ms  (slot s, from 0: KEYS[13s + 1 .. 13s + 13],
  KEYS[3] dead     ZSET id -> time of death ms    in this order)
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] epoch    STRING fencing epoch of the slot owner
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] leases   STRING the last lease number drawn in the slot (never repeats)
  KEYS[9] outcome  HASH id -> remembered outcome of a finished message
  KEYS[10] finished ZSET id -> finished ms
  KEYS[11] schedules HASH schedule id -> packed schedule
  KEYS[12] topup   ZSET schedule id -> ms since its top-up is owed
  KEYS[13] basis    HASH id -> custom slot basis
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV             per slot, in the order of its keys: the number n of its arguments, then
                   its n arguments, claim-13's ARGV[1 .. n] (epoch, max_count, lease_ms, ...)

  Returns, per slot in order, the number m of messages it claimed, then claim-13's reply of
  that slot (its 5-value head, then m pairs id, record): 0 OK or -2 STALE_EPOCH per slot.

  Events: as claim-13's
]]
--@include claim_max_bytes
--@include claim_slot
--@include existing_count
--@include now_us
--@include read_keys

-- asked once for all the slots (header)
local epoch_keys, schedules_keys, topup_keys = {}, {}, {}
for at = 0, #KEYS - 1, 13 do
  epoch_keys[#epoch_keys + 1] = KEYS[at + 6]
  schedules_keys[#schedules_keys + 1] = KEYS[at + 11]
  topup_keys[#topup_keys + 1] = KEYS[at + 12]
end
local epochs = read_keys(epoch_keys)
local series_absent = existing_count(schedules_keys) == 0
local topups_absent = existing_count(topup_keys) == 0
redis.untracked_slots(KEYS, 1, 13)
redis.unbucketed_slots(KEYS, 1, 13)

local reply = {}
local now_micros = now_us()
local first = 1
local budget = {left = CLAIM_MAX_BYTES}  -- one byte budget for the whole call (claim_slot)
for at = 0, #KEYS - 1, 13 do
  local count = tonumber(ARGV[first])
  local known = {epoch = epochs[at / 13 + 1], series_absent = series_absent,
    topups_absent = topups_absent, budget = budget}
  local args = {unpack(ARGV, first + 1, first + count)}
  local claimed = claim_slot(KEYS, at, args, now_micros, known)
  first = first + count + 1
  reply[#reply + 1] = (#claimed - 5) / 2
  for i = 1, #claimed do reply[#reply + 1] = claimed[i] end
end
return reply
