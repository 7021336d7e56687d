#!lua flags=allow-cross-slot-keys
--[[
  Schedule messages into several slots of one broker in one call: schedule-10 run slot after
  slot (schedule_slot), so a producer's batch over many slots costs one call per broker, not
  one per slot. Every per-slot rule is schedule-10's: each slot's own settings record, quota
  share, outcome retention and wake-up. A slot being moved refuses its own messages (SLOT_MOVING
  in place of their triples) and the call goes on with the other slots. What every slot would
  ask alone is asked once for all of them (their epochs, whether any has basis entries or is
  tracked for a doubling): at 1,024 slots a call visits ~630 slots for 1,000 messages, and a
  slot costs Redis commands, not its messages. Standalone brokers only: a Redis Cluster refuses
  keys of several hash tags in one call (docs/contracts.md §1).

  KEYS[1] store    ZSET id -> due ms           of the first slot, then again per further slot
  KEYS[2] prepare  ZSET id -> lease deadline ms  (slot s, from 0: KEYS[10s + 1 .. 10s + 10],
  KEYS[3] dead     ZSET id -> time of death ms    in this order)
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] wake     LIST wake-up marker of the slot
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] outcome  HASH id -> remembered outcome of a finished message
  KEYS[9] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[10] basis   HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)

  ARGV[1 .. 7]     schedule-10's: mode, max_delay_ms, journal_max_len, outcome_retention_ms,
                   expiry_ttl_ms, max_pending (the settings record's fields win, per slot),
                   fields (values per message: 8, or 9 with priorities)
  then per slot, in the order of its keys: the number n of its messages, then its n
                   messages as schedule-10's (ARGV[7] values each)

  Returns a flat array, per message in order (slot after slot) the triple code, due_ms, state,
  as schedule-10's (1 CREATED, 2 EXISTS, 6 ALREADY_DONE, 3 UPDATED, -4 TOO_FAR,
  -7 EXPIRES_BEFORE_DUE, -8 OVER_QUOTA), and for each message of a slot being moved:
    -9 SLOT_MOVING  nothing of that slot changed    due_ms 0, state = the refusal's text

  Events: scheduled (new or replaced)
]]
--@include append
--@include codes
--@include existing_count
--@include moving_refusal
--@include now_ms
--@include read_keys
--@include schedule_slot

-- asked once for all the slots (header)
local epoch_keys, basis_keys = {}, {}
for at = 0, #KEYS - 1, 10 do
  epoch_keys[#epoch_keys + 1] = KEYS[at + 9]
  basis_keys[#basis_keys + 1] = KEYS[at + 10]
end
local epochs = read_keys(epoch_keys)
local bases_absent = existing_count(basis_keys) == 0
redis.untracked_slots(KEYS, 1, 10)

local results = {}
local now = now_ms()
local first = 8
local fields = tonumber(ARGV[7])
for at = 0, #KEYS - 1, 10 do
  local count = tonumber(ARGV[first])
  local last = first + fields * count
  local refusal = moving_refusal(KEYS[at + 9], epochs[at / 10 + 1])
  if refusal then
    for _ = 1, count do append(results, CODE.SLOT_MOVING, 0, refusal) end
  else
    schedule_slot(KEYS, at, ARGV, first + 1, last, now, bases_absent, results)
  end
  first = last + 1
end
return results
