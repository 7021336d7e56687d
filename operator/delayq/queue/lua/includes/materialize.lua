--@include index_group
--@include index_priority
--@include journal
--@include record_group
--@include record_priority

-- Schedule the occurrence `<sid>@<due>` of a recurring schedule as an ordinary message, create
-- only: an id that is already live (materialised before, by a step now retried) is left alone,
-- so materialising is idempotent. True when it was created. The schedule's priority and group,
-- in the occurrence's `record` (occurrence_record: '0:::' and the template, so its lease field
-- ends at byte 4), enter the slot's priority index and group round as a scheduled message's
-- do; a schedule without them costs two bytes' looks.
local function materialize(store, msg, journal_key, journal_max_len, sid, due, record, now)
  local id = sid .. '@' .. due
  if redis.call('HGET', msg, id) then return false end
  redis.call('HSET', msg, id, record)
  redis.call('ZADD', store, due, id)
  index_priority(store, id, record_priority(record, 4), due)
  index_group(store, id, record_group(record, 4), due)
  journal(journal_key, journal_max_len, 'scheduled', id, now, due, 0)
  return true
end
