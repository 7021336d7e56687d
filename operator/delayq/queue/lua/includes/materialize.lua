--@include journal

-- Schedule the occurrence `<sid>@<due>` of a recurring schedule as an ordinary message, create
-- only: an id that is already live (materialised before, by a step now retried) is left alone,
-- so materialising is idempotent. True when it was created.
local function materialize(store, msg, journal_key, journal_max_len, sid, due, record, now)
  local id = sid .. '@' .. due
  if redis.call('HGET', msg, id) then return false end
  redis.call('HSET', msg, id, record)
  redis.call('ZADD', store, due, id)
  journal(journal_key, journal_max_len, 'scheduled', id, now, due, 0)
  return true
end
