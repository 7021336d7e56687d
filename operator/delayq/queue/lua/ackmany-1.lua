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

  KEYS[1] store    ZSET id -> due ms of the first slot, then one per further slot (slot s, from
                   0: KEYS[s + 1]; a slot may come twice, with two epochs); its parts are
                   ack-7's KEYS[1 .. 7] (prepare, msg, epoch, journal, outcome, finished,
                   basis), named `dq:{<tag>}:<part>` after it (slot_prefix), as schedulemany-1
                   names a slot's parts: seven declared keys a slot were more of a call's bytes
                   than its acks when each slot held a message or two (a burst over 1,024 slots)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV[1 .. 2]     ack-7's ARGV[2 .. 3]: journal_max_len, outcome_retention_ms (the settings
                   record's fields win, per slot)
  then per slot, in the order of its keys: the caller's epoch of the slot, the number n of its
                   messages, then n pairs id, lease (as ack-7's)

  Returns a flat array, per message in order (slot after slot) ack-7's code: 7 ACKED,
  -3 LEASE_LOST, or -2 STALE_EPOCH for every message of a slot whose epoch is not the given one.
  A key that is not a slot's store key and a slot's count beyond the arguments given are refused
  (an error) before anything is written.

  Events: acked
]]
--@include ack_slot
--@include now_ms
--@include slot_count
--@include slot_part_keys
--@include slots_header

-- ack-7's KEYS order
local PARTS = {'prepare', 'msg', 'epoch', 'journal', 'outcome', 'finished', 'basis'}

local prefixes, _, epochs, absent = slots_header(KEYS, {'basis', 'finished'})

local first = 3
for _ = 1, #KEYS do  -- every slot's count checked before anything is written (slot_count)
  first = first + 2 + 2 * slot_count(ARGV[first + 1], first + 2, 2, #ARGV)
end

local results = {}
local now = now_ms()
local head = {ARGV[1], ARGV[2]}
first = 3
for s = 1, #KEYS do
  local keys = slot_part_keys(prefixes[s], PARTS)
  local epoch, count = ARGV[first], tonumber(ARGV[first + 1])
  local last = first + 1 + 2 * count
  local known = {epoch = epochs[s], bases_absent = absent.basis,
    finished_absent = absent.finished}
  ack_slot(keys, 0, head, epoch, ARGV, first + 2, last, now, known, results)
  first = last + 1
end
return results
