--@include call_chunked
--@include codes
--@include end_group_lease
--@include epoch_matches
--@include forget_bases
--@include forget_expired
--@include journal
--@include read_chunked
--@include record_fields
--@include remember
--@include topic_settings

-- Acknowledge leased messages of one slot, appending each one's code to `results`: the body of
-- ack-7 (whose header is the contract: KEYS, ARGV, codes) and of ackmany-1, which runs it once
-- per slot and epoch. `keys[at + 1 .. at + 7]` are the slot's keys in ack-7's KEYS order;
-- `head` ack-7's ARGV[2 .. 3] (journal_max_len, outcome_retention_ms: the record's fields win);
-- `epoch` the caller's; `args[first .. last]` the pairs id, lease; `now` the server clock in ms
-- (one reading per call). `known` what ackmany-1 asked once for all its slots, or nil:
-- `epoch` the slot's epoch as read (false: unset), `bases_absent` / `finished_absent` true when
-- no slot of the call had basis entries / remembered outcomes at its start.
local function ack_slot(keys, at, head, epoch, args, first, last, now, known, results)
  local prepare, msg, epoch_key, journal_key, outcome, finished, basis =
    keys[at + 1], keys[at + 2], keys[at + 3], keys[at + 4], keys[at + 5], keys[at + 6],
    keys[at + 7]
  local journal_max_len, retention_ms =
    topic_settings(prepare, {'journal_max_len', 'outcome_retention_ms'}, {head[1], head[2]})
  journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
  known = known or {}

  if not epoch_matches(epoch_key, epoch, known.epoch) then
    for _ = first, last, 2 do results[#results + 1] = CODE.STALE_EPOCH end
    return
  end

  local ids = {}
  for i = first, last, 2 do ids[#ids + 1] = args[i] end
  local leased = read_chunked('ZMSCORE', prepare, ids)
  local records = read_chunked('HMGET', msg, ids)
  -- the leases were all read before any is acked: an id given twice in one call is acked once,
  -- its repeat answered LEASE_LOST as it would be in a call of its own
  local done, acked = {}, {}
  for k = 1, #ids do
    local id, record = ids[k], leased[k] and records[k]
    local attempts, due, lease, p3 = nil, nil, nil, nil
    if record and not acked[id] then attempts, due, lease, p3 = record_fields(record) end
    if lease ~= nil and lease == args[first + 2 * k - 1] then
      done[#done + 1] = id
      acked[id] = true
      end_group_lease(prepare, id, record, p3, now)
      journal(journal_key, journal_max_len, 'acked', id, now, due, attempts)
      remember(outcome, finished, retention_ms, now, id, 'done', attempts)
      results[#results + 1] = CODE.ACKED
    else
      results[#results + 1] = CODE.LEASE_LOST
    end
  end
  if #done > 0 then
    call_chunked('ZREM', prepare, done)
    call_chunked('HDEL', msg, done)
    if not known.bases_absent then forget_bases(basis, retention_ms, done) end
  end
  -- nothing to forget in a slot that remembered nothing before the call nor in it
  if not (known.finished_absent and (retention_ms == 0 or #done == 0)) then
    forget_expired(outcome, finished, basis, msg, retention_ms, now, #done)
  end
end
