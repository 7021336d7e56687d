#!lua flags=allow-oom,allow-cross-slot-keys
--[[
  Acknowledge leased messages of several slots of one broker in one call: ack-7 run slot after
  slot (ack_slot), so a consumer's acks over many slots cost one call per broker, not one per
  slot (a herd over 1,024 slots was acked in ~1,000 calls). Every slot is fenced by the epoch
  given for it: a slot whose epoch is not that one answers STALE_EPOCH for its messages and
  nothing of it changes, and the call goes on with the others. What every slot would ask alone
  is asked once for all of them (their epochs, whether any has basis entries or remembered
  outcomes, whether any is tracked for a doubling), as in schedulemany-1. Standalone brokers
  only, as schedulemany-1 (docs/contracts.md §1). Runs under maxmemory (allow-oom), as ack-7.

  KEYS[1] prepare  ZSET id -> lease deadline ms   of the first slot, then again per further
  KEYS[2] msg      HASH id -> record                slot (slot s, from 0: KEYS[7s + 1 ..
  KEYS[3] epoch    STRING fencing epoch of the slot owner   7s + 7], in this order; a slot may
  KEYS[4] journal  STREAM lifecycle events           come twice, with two epochs)
  KEYS[5] outcome  HASH id -> remembered outcome of a finished message
  KEYS[6] finished ZSET id -> finished ms
  KEYS[7] basis    HASH id -> custom slot basis
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV[1 .. 2]     ack-7's ARGV[2 .. 3]: journal_max_len, outcome_retention_ms (the settings
                   record's fields win, per slot)
  then per slot, in the order of its keys: the caller's epoch of the slot, the number n of its
                   messages, then n pairs id, lease (as ack-7's)

  Returns a flat array, per message in order (slot after slot) ack-7's code: 7 ACKED,
  -3 LEASE_LOST, or -2 STALE_EPOCH for every message of a slot whose epoch is not the given one.
  A slot's count beyond the arguments given is refused (an error) before anything is written.

  Events: acked
]]
--@include ack_slot
--@include existing_count
--@include now_ms
--@include read_keys
--@include slot_count

-- asked once for all the slots (header)
local epoch_keys, finished_keys, basis_keys = {}, {}, {}
for at = 0, #KEYS - 1, 7 do
  epoch_keys[#epoch_keys + 1] = KEYS[at + 3]
  finished_keys[#finished_keys + 1] = KEYS[at + 6]
  basis_keys[#basis_keys + 1] = KEYS[at + 7]
end
local epochs = read_keys(epoch_keys)
local bases_absent = existing_count(basis_keys) == 0
local finished_absent = existing_count(finished_keys) == 0
redis.untracked_slots(KEYS, 1, 7)
redis.unbucketed_slots(KEYS, 1, 7)

local first = 3
for _ = 1, #KEYS, 7 do  -- every slot's count checked before anything is written (slot_count)
  first = first + 2 + 2 * slot_count(ARGV[first + 1], first + 2, 2, #ARGV)
end

local results = {}
local now = now_ms()
local head = {ARGV[1], ARGV[2]}
first = 3
for at = 0, #KEYS - 1, 7 do
  local epoch, count = ARGV[first], tonumber(ARGV[first + 1])
  local last = first + 1 + 2 * count
  local known = {epoch = epochs[at / 7 + 1], bases_absent = bases_absent,
    finished_absent = finished_absent}
  ack_slot(KEYS, at, head, epoch, ARGV, first + 2, last, now, known, results)
  first = last + 1
end
return results
