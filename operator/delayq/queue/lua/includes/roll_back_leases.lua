--@include end_group_lease
--@include give_up
--@include index_group
--@include index_priority
--@include journal
--@include record_extras
--@include record_fields
--@include record_group
--@include record_priority
--@include record_with
--@include retries_exhausted
--@include retry_delay

-- Leased messages whose lease is over, already read from prepare (`ids`): each goes back to
-- store, keeping its priority (index_priority), its attempt counted (the lease's holder may have
-- delivered it: the next attempt tells the receiver it is a retry), or is given up once its
-- retries are exhausted. With a retry `backoff` (retry_delay) it is due its retry delay after
-- its lease's deadline, when the attempt failed, not after this rollback: a claim that comes
-- late (nobody polled, or an earlier claim's rollback_max left it) adds no delay of its own, as
-- a nack's delay counts from the nack. Without one (nil: a takeover) it is due `now`.
-- A lease is over when its deadline passed (claim-13) or when a new owner fenced the slot
-- (fence-10): an ack carrying the old epoch is refused from then on, so waiting for the
-- deadline would only make the message late. `slot` holds the keys and settings give_up
-- needs. Returns how many were given up (the caller trims remembered outcomes for them).
local function roll_back_leases(slot, store, prepare, ids, now, max_retries, retry_for_ms,
    exhausted_action, backoff)
  local given_up = 0
  for n, id in ipairs(ids) do
    local deadline = tonumber(redis.call('ZSCORE', prepare, id))
    local was_leased = redis.call('ZREM', prepare, id) == 1
    local record = redis.call('HGET', slot.msg, id)
    if record then
      local attempts, due, _, p3 = record_fields(record)
      local _, first_ms, stop = record_extras(record, p3)
      end_group_lease(store, id, record, p3, now)
      journal(slot.journal, slot.journal_max_len, 'expired', id, now, due, attempts)
      local retry_due = now
      if backoff ~= nil then retry_due = deadline + retry_delay(backoff, attempts, n) end
      -- the window is checked at the next attempt's time (never before now), as a nack's is
      if retries_exhausted(attempts, max_retries, first_ms, retry_for_ms,
          math.max(now, retry_due)) then
        give_up(slot, id, exhausted_action, 'lease expired on attempt ' .. attempts, 'dropped',
          now, due, attempts)
        given_up = given_up + 1
      else
        redis.call('HSET', slot.msg, id, record_with(record, attempts, '', '', p3))
        if was_leased then redis.note_absent(store, {id}) end  -- so not in store
        redis.call('ZADD', store, retry_due, id)
        index_priority(store, id, record_priority(record, stop), retry_due)
        index_group(store, id, record_group(record, p3), retry_due)
      end
    end
  end
  return given_up
end
