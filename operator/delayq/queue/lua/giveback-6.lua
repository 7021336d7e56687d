#!lua flags=allow-oom
--[[
  Give leased messages back undelivered (a graceful handoff): prepare -> store at the due time
  they were claimed for, without counting the attempt, so the slot's next owner delivers them at
  once instead of waiting for their leases to expire. Used for messages claimed but not yet handed
  to a handler when their slot is released or their lease can no longer be honoured.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] msg      HASH id -> record
  KEYS[4] epoch    STRING fencing epoch of the slot owner
  KEYS[5] wake     LIST wake-up marker of the slot
  KEYS[6] journal  STREAM lifecycle events
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] epoch           the caller's fencing epoch
  ARGV[2] journal_max_len  0 = journal off (record)
  ARGV[3 + 2k], ARGV[4 + 2k]  per message: id, lease

  Returns, per message:
    13 GIVEN_BACK  waits in store again, due when it was due, attempts as before the claim
    -2 STALE_EPOCH the caller is not the current owner: nothing was changed (whole call)
    -3 LEASE_LOST  not leased under that lease any more: nothing was changed for that id

  Runs under maxmemory (allow-oom): it moves messages back and rewrites records no larger.

  Events: givenback
]]
--@include codes
--@include end_group_lease
--@include epoch_matches
--@include index_group
--@include index_priority
--@include journal
--@include leased_record
--@include now_ms
--@include record_fields
--@include record_group
--@include record_priority
--@include record_with
--@include topic_settings
--@include wake_if_earliest

local store, prepare, msg, epoch_key, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[2]}))
local results = {}

if not epoch_matches(epoch_key, ARGV[1]) then
  for i = 3, #ARGV, 2 do results[#results + 1] = CODE.STALE_EPOCH end
  return results
end
local now = now_ms()
local earliest = nil

for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local record = leased_record(prepare, msg, id, ARGV[i + 1])
  if not record then
    results[#results + 1] = CODE.LEASE_LOST
  else
    local attempts, due, _, p3 = record_fields(record)
    local due_ms = tonumber(due) or now
    redis.call('ZREM', prepare, id)
    end_group_lease(store, id, record, p3, now)
    redis.call('HSET', msg, id, record_with(record, math.max(attempts - 1, 0), '', ''))
    redis.note_absent(store, {id})  -- it was leased, so not in store
    redis.call('ZADD', store, due_ms, id)
    index_priority(store, id, record_priority(record), due_ms)
    index_group(store, id, record_group(record, p3), due_ms)
    journal(journal_key, journal_max_len, 'givenback', id, now, due_ms, attempts - 1)
    if earliest == nil or due_ms < earliest then earliest = due_ms end
    results[#results + 1] = CODE.GIVEN_BACK
  end
end

if earliest then wake_if_earliest(store, wake, earliest) end
return results
