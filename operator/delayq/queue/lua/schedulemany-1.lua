#!lua flags=allow-cross-slot-keys
--[[
  Schedule messages into several slots of one broker in one call: schedule-10 run slot after
  slot (schedule_slot), so a producer's batch over many slots costs one call per broker, not
  one per slot. Every per-slot rule is schedule-10's: each slot's own settings record, quota
  share, outcome retention and wake-up. A slot being moved refuses its own messages (SLOT_MOVING
  in place of their triples) and the call goes on with the other slots. What every slot would
  ask alone is asked once for all of them (their epochs, whether any has basis entries or is
  tracked for a doubling): at 1,024 slots a call visits ~630 slots for 1,000 messages, and a
  slot costs Redis commands, not its messages. Each slot is declared by its `store` key alone;
  the script names its other parts from that key's hash tag (slot_prefix), as schedule-10's
  KEYS[2 .. 10] are named: ten declared keys a slot were ~8,000 key names a call for Python to
  pack, Redis to parse, check against the caller's ACL key patterns and hand to Lua. Standalone
  brokers only: a Redis Cluster refuses keys of several hash tags in one call (docs/contracts.md
  §1).

  KEYS[1] store    ZSET id -> due ms of the first slot, then one per further slot (slot s, from
                   0: KEYS[s + 1]); its prepare, dead, msg, reason, wake, journal, outcome,
                   epoch ('moving:<epoch>' while the slot moves: refused) and basis parts are
                   schedule-10's KEYS[2 .. 10], named `dq:{<tag>}:<part>` after it (and the
                   slot's settings record and priority index, by its hash tag: topic_settings,
                   includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV[1 .. 7]     schedule-10's: mode, max_delay_ms, journal_max_len, outcome_retention_ms,
                   expiry_ttl_ms, max_pending (the settings record's fields win, per slot),
                   fields (values per message: 8, 9 with priorities, 10 with groups)
  then per slot, in the order of its keys: the number n of its messages, then its n
                   messages as schedule-10's (ARGV[7] values each)

  Returns a flat array, per message in order (slot after slot) the triple code, due_ms, state,
  as schedule-10's (1 CREATED, 2 EXISTS, 6 ALREADY_DONE, 3 UPDATED, -4 TOO_FAR,
  -7 EXPIRES_BEFORE_DUE, -8 OVER_QUOTA), and for each message of a slot being moved:
    -9 SLOT_MOVING  nothing of that slot changed    due_ms 0, state = the refusal's text
  A key that is not a slot's store key, a number of values a message other than 8 or 9 and a
  slot's message count beyond the arguments given are refused (an error) before anything is
  written.

  Events: scheduled (new or replaced)
]]
--@include append
--@include codes
--@include moving_refusal
--@include now_ms
--@include schedule_fields
--@include schedule_slot
--@include slot_count
--@include slots_header

local prefixes, epoch_keys, epochs, absent = slots_header(KEYS, {'basis'})
local bases_absent = absent.basis

local fields = schedule_fields(ARGV[7])
local first = 8
for _ = 1, #KEYS do  -- every slot's count checked before anything is written (slot_count)
  first = first + fields * slot_count(ARGV[first], first + 1, fields, #ARGV) + 1
end

local results = {}
local now = now_ms()
first = 8
for s = 1, #KEYS do
  local count = tonumber(ARGV[first])
  local last = first + fields * count
  local refusal = moving_refusal(epoch_keys[s], epochs[s])
  if refusal then
    for _ = 1, count do append(results, CODE.SLOT_MOVING, 0, refusal) end
  else
    schedule_slot(prefixes[s], ARGV, first + 1, last, now, bases_absent, results)
  end
  first = last + 1
end
return results
