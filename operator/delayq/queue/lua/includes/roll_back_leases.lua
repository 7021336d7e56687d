--@include give_up
--@include index_priority
--@include journal
--@include record_extras
--@include record_fields
--@include record_priority
--@include record_with
--@include retries_exhausted
--@include retry_delay

-- Leased messages whose lease is over, already read from prepare (`ids`): each goes back to
-- store due `now` plus its retry delay (`backoff`, nil: none; retry_delay), keeping its
-- priority (index_priority), its attempt counted (the lease's holder may have delivered it: the next
-- attempt tells the receiver it is a retry), or is given up once its retries are exhausted.
-- A lease is over when its deadline passed (claim-13) or when a new owner fenced the slot
-- (fence-10): an ack carrying the old epoch is refused from then on, so waiting for the
-- deadline would only make the message late. `slot` holds the keys and settings give_up
-- needs. Returns how many were given up (the caller trims remembered outcomes for them).
local function roll_back_leases(slot, store, prepare, ids, now, max_retries, retry_for_ms,
    exhausted_action, backoff)
  local given_up = 0
  for n, id in ipairs(ids) do
    redis.call('ZREM', prepare, id)
    local record = redis.call('HGET', slot.msg, id)
    if record then
      local attempts, due, _, p3 = record_fields(record)
      local _, first_ms, stop = record_extras(record, p3)
      journal(slot.journal, slot.journal_max_len, 'expired', id, now, due, attempts)
      -- the window is checked at the next attempt's time, as a nack's is
      local retry_due = now + retry_delay(backoff, attempts, n)
      if retries_exhausted(attempts, max_retries, first_ms, retry_for_ms, retry_due) then
        give_up(slot, id, exhausted_action, 'lease expired on attempt ' .. attempts, 'dropped',
          now, due, attempts)
        given_up = given_up + 1
      else
        redis.call('HSET', slot.msg, id, record_with(record, attempts, '', '', p3))
        redis.call('ZADD', store, retry_due, id)
        index_priority(store, id, record_priority(record, stop), retry_due)
      end
    end
  end
  return given_up
end
