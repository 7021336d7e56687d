--@include group_keys
--@include record_group
--@include wake_at

-- The lease of `id` (its leased `record`; `p3` from record_fields) ended: acked, nacked,
-- rolled back (expired, fenced), given back, cancelled, rescheduled or replaced. A grouped
-- message leaves its group's leases, and its group, if parked at its in-flight bound (+inf),
-- is back in the round at `now`, its slot's consumer woken. Costs one byte's look for a message without a group.
local function end_group_lease(key, id, record, p3, now)
  local group = record_group(record, p3)
  if not group then return end
  local _, groups, leases = group_keys(key)
  redis.call('ZREM', leases, group .. '\0' .. id)
  if redis.call('ZSCORE', groups, group) == 'inf' then
    redis.call('ZADD', groups, 'XX', string.format('%d', now), group)
    -- its consumer was told of nothing due in the group (claim_slot's next due): wake it now
    wake_at(string.match(key, '^(dq:{.-}:)') .. 'wake', '1')
  end
end
