#!lua flags=allow-oom
--[[
  Negatively acknowledge leased messages (two-phase consumption, roll back): the message waits
  again for exactly delay_ms after server now, or is given up — to dead, or dropped, per the
  topic — when its attempts are exhausted (max_retries, or the retry would fall after the retry
  window), or when the retry would fall after its expiry; a message the caller says can never
  succeed goes to dead (a poison message must not block its slot).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] epoch    STRING fencing epoch of the slot owner
  KEYS[7] wake     LIST wake-up marker of the slot
  KEYS[8] journal  STREAM lifecycle events
  KEYS[9] outcome  HASH id -> remembered outcome of a finished message
  KEYS[10] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[11] basis    HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] epoch           the caller's fencing epoch
  ARGV[2] max_retries     attempts beyond this are exhausted (record)
  ARGV[3] journal_max_len  0 = journal off (record)
  ARGV[4] retry_for_ms    retries end this long after the first attempt (0 = no window) (record)
  ARGV[5] retry_exhausted_action  'dead' | 'drop' once retries are exhausted (record)
  ARGV[6] expiry_action   'dead' | 'drop' for a retry that would fall after the expiry (record)
  ARGV[7] outcome_retention_ms  0 = dropped messages are not remembered (record)
  ARGV[8 + 5k .. 12 + 5k] per message: id, lease, delay_ms, reason, dead ('1' = dead now)

  Returns, flat, per message: code, due_ms
     8 RETRY_SCHEDULED  waits in store until due_ms
     9 DEAD             moved to dead at due_ms (= now)
    14 DROPPED          given up and deleted (remembered as 'dropped' or 'expired')
    -2 STALE_EPOCH      the caller is not the current owner: nothing was changed (whole call)
    -3 LEASE_LOST       not leased under that lease any more: nothing was changed for that id

  Runs under maxmemory (allow-oom): a retry moves the message back to store (a few bytes at
  most), and a full Redis must keep failing deliveries into their retries.

  Events: nacked (due = the retry's due time; the delivered due when it is given up), dead,
  dropped
]]
--@include append
--@include codes
--@include end_group_lease
--@include epoch_matches
--@include forget_expired
--@include give_up
--@include index_group
--@include index_priority
--@include journal
--@include leased_record
--@include now_ms
--@include record_extras
--@include record_fields
--@include record_group
--@include record_priority
--@include record_with
--@include retries_exhausted
--@include topic_settings
--@include wake_if_earliest

local store, prepare, msg, epoch_key, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[7], KEYS[8]
local max_retries, journal_max_len, retry_for_ms, exhausted_action, expiry_action, retention_ms =
  topic_settings(KEYS[1], {'max_retries', 'journal_max_len', 'retry_for_ms',
    'retry_exhausted_action', 'expiry_action', 'outcome_retention_ms'},
    {ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]})
max_retries, journal_max_len = tonumber(max_retries), tonumber(journal_max_len)
retry_for_ms = tonumber(retry_for_ms)
local slot = {
  dead = KEYS[3], reason = KEYS[5], msg = msg, journal = journal_key, outcome = KEYS[9],
  finished = KEYS[10], basis = KEYS[11], journal_max_len = journal_max_len, retention_ms = tonumber(retention_ms),
}
local results = {}

if not epoch_matches(epoch_key, ARGV[1]) then
  for i = 8, #ARGV, 5 do append(results, CODE.STALE_EPOCH, 0) end
  return results
end
local now = now_ms()
local earliest = nil
local given_up = 0

for i = 8, #ARGV, 5 do
  local id, delay_ms = ARGV[i], tonumber(ARGV[i + 2])
  local why, dead_now = ARGV[i + 3], ARGV[i + 4] == '1'
  local record = leased_record(prepare, msg, id, ARGV[i + 1])
  if not record then
    append(results, CODE.LEASE_LOST, 0)
  else
    local attempts, due, _, p3 = record_fields(record)
    local expire_ms, first_ms, stop = record_extras(record, p3)
    local retry_due = now + delay_ms
    redis.call('ZREM', prepare, id)
    end_group_lease(store, id, record, p3, now)
    local action, dropped_state = nil, nil
    if dead_now then
      action = 'dead'
    elseif retries_exhausted(attempts, max_retries, first_ms, retry_for_ms, retry_due) then
      action, dropped_state = exhausted_action, 'dropped'
    elseif expire_ms and retry_due > expire_ms then
      action, dropped_state, why = expiry_action, 'expired', 'expired'
    end
    if action then
      journal(journal_key, journal_max_len, 'nacked', id, now, due, attempts)
      local to_dead = give_up(slot, id, action, why, dropped_state, now, due, attempts)
      given_up = given_up + 1
      append(results, to_dead and CODE.DEAD or CODE.DROPPED, now)
    else
      redis.call('HSET', msg, id, record_with(record, attempts, '', '', p3))
      redis.note_absent(store, {id})  -- it was leased, so not in store
      redis.call('ZADD', store, retry_due, id)
      index_priority(store, id, record_priority(record, stop), retry_due)
      index_group(store, id, record_group(record, p3), retry_due)
      journal(journal_key, journal_max_len, 'nacked', id, now, retry_due, attempts)
      if earliest == nil or retry_due < earliest then earliest = retry_due end
      append(results, CODE.RETRY_SCHEDULED, retry_due)
    end
  end
end

if earliest then wake_if_earliest(store, wake, earliest) end
if given_up > 0 then
  forget_expired(slot.outcome, slot.finished, slot.basis, slot.msg, slot.retention_ms, now,
    given_up)
end
return results
