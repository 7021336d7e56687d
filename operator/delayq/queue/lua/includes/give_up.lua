--@include forget_bases
--@include journal
--@include remember

-- A message that will not be delivered (its retries are exhausted, or it expired), already
-- taken out of store or prepare. Action 'dead' moves it to the slot's dead set with `why`;
-- 'drop' deletes it, remembered for the topic's outcome retention as `dropped_state`
-- ('dropped' | 'expired'), its slot basis entry kept as long as that outcome (forget_bases;
-- a dead one keeps it: it can be redriven). `slot` holds the keys (dead, reason, msg, journal,
-- outcome, finished, basis) and settings (journal_max_len, retention_ms). Returns true when it went to dead.
local function give_up(slot, id, action, why, dropped_state, now, due, attempts)
  if action == 'drop' then
    redis.call('HDEL', slot.msg, id)
    remember(slot.outcome, slot.finished, slot.retention_ms, now, id, dropped_state, attempts)
    forget_bases(slot.basis, slot.retention_ms, {id})
    journal(slot.journal, slot.journal_max_len, 'dropped', id, now, due, attempts)
    return false
  end
  redis.call('ZADD', slot.dead, now, id)
  redis.call('HSET', slot.reason, id, why)
  journal(slot.journal, slot.journal_max_len, 'dead', id, now, due, attempts)
  return true
end
