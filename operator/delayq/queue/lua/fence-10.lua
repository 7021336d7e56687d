#!lua flags=allow-oom
--[[
  Take over a slot: raise its fencing epoch, and roll back every lease of the previous owners.
  From this call on, every claim, ack, nack, extend or give-back carrying an older epoch is
  refused, so a former owner cut off by a partition can move nothing; its leases can therefore
  never be acked any more, and waiting for their deadlines would only make their messages late
  (after a kill -9, a SIGSTOP or a partition: a whole lease). So they go back to store due now,
  in this same call: a crash at any point leaves either the old owner's leases and epoch or the
  new epoch with nothing leased under the old one.

  The new epoch is the larger of the old one + 1 and the server clock in ms: epochs keep rising
  even when a Redis failover or an `everysec` AOF loses the last increments, so an epoch (and
  with it a lease token) handed out before such a loss is never handed out again.

  A rolled-back lease counts as an attempt, as an expired one does (roll_back_leases): the old
  owner may have delivered it before it stopped, and a message that crashes every process
  handling it must still run out of retries.

  KEYS[1] epoch    STRING fencing epoch of the slot owner; 'moving:<epoch>' while the slot moves
  KEYS[2] store    ZSET id -> due ms
  KEYS[3] prepare  ZSET id -> lease deadline ms
  KEYS[4] dead     ZSET id -> time of death ms
  KEYS[5] msg      HASH id -> record
  KEYS[6] reason   HASH id -> dead reason
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] outcome  HASH id -> remembered outcome of a finished message
  KEYS[9] finished ZSET id -> finished ms (the order remembered outcomes are forgotten in)
  KEYS[10] basis   HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] max_retries     attempts beyond this are dead (record)
  ARGV[2] journal_max_len  0 = journal off (record)
  ARGV[3] retry_for_ms    retries end this long after the first attempt (0 = no window) (record)
  ARGV[4] retry_exhausted_action  'dead' | 'drop' once retries are exhausted (record)
  ARGV[5] outcome_retention_ms  0 = dropped messages are not remembered (record)

  Returns the new epoch (an integer >= 1); a slot being moved to another broker (frozen by
  freeze-1) raises a SLOT_MOVING error instead, with nothing changed: its owner takes it over
  on the new broker.

  Cost: one step per leased message of the slot (at most what its owners had in flight).

  Runs under maxmemory (allow-oom): a full Redis must still let a slot change owner (its
  messages would otherwise wait for memory to be freed by hand); rolling back grows nothing.

  Events: expired (a lease of a previous owner rolled back), dead or dropped (its attempts
  exhausted)
]]
--@include forget_expired
--@include journal
--@include now_ms
--@include refuse_if_moving
--@include roll_back_leases
--@include topic_settings

refuse_if_moving(KEYS[1])

local epoch_key, store, prepare = KEYS[1], KEYS[2], KEYS[3]
local max_retries, journal_max_len, retry_for_ms, exhausted_action, retention_ms =
  topic_settings(KEYS[1], {'max_retries', 'journal_max_len', 'retry_for_ms',
    'retry_exhausted_action', 'outcome_retention_ms'}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]})
local slot = {
  dead = KEYS[4], msg = KEYS[5], reason = KEYS[6], journal = KEYS[7], outcome = KEYS[8],
  finished = KEYS[9], basis = KEYS[10], journal_max_len = tonumber(journal_max_len),
  retention_ms = tonumber(retention_ms),
}
local now = now_ms()
local epoch = math.max((tonumber(redis.call('GET', epoch_key)) or 0) + 1, now)
redis.call('SET', epoch_key, epoch)

local leased = redis.call('ZRANGE', prepare, 0, -1)
local given_up = roll_back_leases(slot, store, prepare, leased, now, tonumber(max_retries),
  tonumber(retry_for_ms), exhausted_action)
if given_up > 0 then
  forget_expired(slot.outcome, slot.finished, slot.basis, slot.msg, slot.retention_ms, now,
    given_up)
end
return epoch
