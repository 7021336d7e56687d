--[[
  Restore a backup's items into one slot (`delayq pipeline restore`), create-only: an item whose
  id the slot already holds (live, or remembered within the retention) is left as it is, so a
  restore run twice, or into a topic that delivered meanwhile, stores nothing twice. Records
  come as the backup read them (attempts and tagged instants kept), with no lease (a restored
  in-flight message waits again at the due its lease was for); Python shifted every instant.

  KEYS[1] store     ZSET id -> due ms
  KEYS[2] prepare   ZSET id -> lease deadline ms
  KEYS[3] dead      ZSET id -> time of death ms
  KEYS[4] msg       HASH id -> record
  KEYS[5] reason    HASH id -> dead reason
  KEYS[6] wake      LIST wake-up marker of the slot
  KEYS[7] journal   STREAM lifecycle events
  KEYS[8] outcome   HASH id -> remembered outcome of a finished message
  KEYS[9] epoch     STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[10] basis    HASH id -> custom slot basis (only messages scheduled with one)
  KEYS[11] finished ZSET id -> finished ms
  KEYS[12] schedules HASH schedule id -> packed recurring schedule
  KEYS[13] topup    ZSET schedule id -> ms since it owes a top-up
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)

  ARGV[1] journal_max_len       0 = journal off
  ARGV[2] outcome_retention_ms  0 = finished messages are not remembered
  ARGV[3] max_delay_ms          a waiting message due beyond server now + this is refused
  ARGV[4] max_pending           the slot's share of limits.maxPending (0 = no limit)
  ARGV 1, 2 and 4 are the caller's: the topic's settings record wins where it holds the field
  (includes/topic_settings.lua)
  ARGV[5 + 6k .. 10 + 6k]       per item: kind ('waiting' | 'dead' | 'outcome' | 'schedule'),
                                id, ms (due, time of death, finished ms, the top-up owed
                                since or ''), value (record, outcome or packed schedule),
                                reason (dead only), slot basis ('' = none recorded)

  Returns a flat array, per item in order the pair code, ms:
     1 CREATED      restored; ms = the item's ms
     2 EXISTS       the slot holds the id (a message, or a schedule): nothing changed;
                    ms = the item's ms
     6 ALREADY_DONE a message id that finished within the retention: nothing changed;
                    ms = its finished ms
    -4 TOO_FAR      a waiting message due beyond now + max_delay_ms: nothing changed
    -8 OVER_QUOTA   a waiting message beyond max_pending: nothing changed

  Events: scheduled (a waiting message restored; dead letters, outcomes and schedules are
  restored without an event: nothing happened to them)
]]
--@include append
--@include codes
--@include index_group
--@include index_priority
--@include journal
--@include now_ms
--@include record_fields
--@include record_group
--@include record_priority
--@include refuse_if_moving
--@include remembered
--@include topic_settings
--@include wake_if_earliest

refuse_if_moving(KEYS[9])

local store, prepare, dead, msg, reason, wake, journal_key, outcome, basis, finished =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[10], KEYS[11]
local schedules, topup = KEYS[12], KEYS[13]
local max_delay_ms = tonumber(ARGV[3])
local journal_max_len, retention_ms, max_pending = topic_settings(KEYS[1],
  {'journal_max_len', 'outcome_retention_ms', 'limits_max_pending'}, {ARGV[1], ARGV[2], ARGV[4]})
journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
max_pending = tonumber(max_pending)
local now = now_ms()
local pending_count = nil
if max_pending > 0 then
  pending_count = redis.call('ZCARD', store) + redis.call('ZCARD', prepare)
end

local results = {}
local earliest = nil
for i = 5, #ARGV, 6 do
  local kind, id, ms, value = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local given_basis = ARGV[i + 5]
  if kind == 'schedule' then
    if redis.call('HGET', schedules, id) then
      append(results, CODE.EXISTS, ms or '')
    else
      redis.call('HSET', schedules, id, value)
      if ms then redis.call('ZADD', topup, ms, id) end
      append(results, CODE.CREATED, ms or '')
    end
  else
    local live = redis.call('HGET', msg, id)
    local finished_state, finished_ms = nil, nil
    if not live then
      finished_state, finished_ms = remembered(redis.call('HGET', outcome, id), retention_ms, now)
    end
    if live then
      append(results, CODE.EXISTS, ms)
    elseif finished_state then
      append(results, CODE.ALREADY_DONE, finished_ms)
    elseif kind == 'outcome' then
      redis.call('HSET', outcome, id, value)
      redis.call('ZADD', finished, ms, id)
      append(results, CODE.CREATED, ms)
    elseif kind == 'waiting' and ms > now + max_delay_ms then
      append(results, CODE.TOO_FAR, ms)
    elseif kind == 'waiting' and pending_count and pending_count >= max_pending then
      append(results, CODE.OVER_QUOTA, ms)
    else
      redis.call('HSET', msg, id, value)
      if given_basis ~= '' then redis.call('HSET', basis, id, given_basis) end
      if kind == 'dead' then
        redis.call('ZADD', dead, ms, id)
        redis.call('HSET', reason, id, ARGV[i + 4])
      else
        redis.call('ZADD', store, ms, id)
        index_priority(store, id, record_priority(value), ms)
        index_group(store, id, record_group(value, select(4, record_fields(value))), ms)
        if pending_count then pending_count = pending_count + 1 end
        if earliest == nil or ms < earliest then earliest = ms end
        journal(journal_key, journal_max_len, 'scheduled', id, now, ms, 0)
      end
      append(results, CODE.CREATED, ms)
    end
  end
end
if earliest then wake_if_earliest(store, wake, earliest) end
return results
