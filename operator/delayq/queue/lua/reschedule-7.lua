--[[
  Move the due time of live messages by id (reschedule by (kind, id), seed 002). A leased message
  loses its lease and waits again; a dead message must be redriven instead.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] wake     LIST wake-up marker of the slot
  KEYS[6] journal  STREAM lifecycle events
  KEYS[7] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] max_delay_ms
  ARGV[2] journal_max_len  0 = journal off (record)
  ARGV[3 + 3k .. 5 + 3k]  per message: id, when_kind ('delay' | 'at'), when_ms

  Returns, flat, per message: code, due_ms
     5 RESCHEDULED   waits in store until due_ms
    -1 NOT_FOUND     no such message
    -4 TOO_FAR       due beyond now + max_delay_ms, nothing changed
    -6 WRONG_STATE   the message is dead (use redrive)

  Events: rescheduled
]]
--@include append
--@include codes
--@include end_group_lease
--@include index_group
--@include index_priority
--@include journal
--@include locate
--@include now_ms
--@include record_fields
--@include record_group
--@include record_priority
--@include record_with
--@include refuse_if_moving
--@include topic_settings
--@include wake_if_earliest

refuse_if_moving(KEYS[7])

local store, prepare, dead, msg, wake, journal_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local max_delay_ms = tonumber(ARGV[1])
local journal_max_len = tonumber(topic_settings(KEYS[1], {'journal_max_len'}, {ARGV[2]}))
local now = now_ms()
local results = {}
local earliest = nil

for i = 3, #ARGV, 3 do
  local id, when_kind, when_ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local due = when_ms
  if when_kind == 'delay' then due = now + when_ms end
  local state = locate(store, prepare, dead, id)
  if not state then
    append(results, CODE.NOT_FOUND, due)
  elseif state == 'dead' then
    append(results, CODE.WRONG_STATE, due)
  elseif due > now + max_delay_ms then
    append(results, CODE.TOO_FAR, due)
  else
    -- false for an id without a record (an orphan): moved all the same, a claim removes it
    local record = redis.call('HGET', msg, id)
    if state == 'prepared' then
      redis.call('ZREM', prepare, id)
      if record then
        local attempts, _, _, p3 = record_fields(record)
        end_group_lease(store, id, record, p3, now)
        redis.call('HSET', msg, id, record_with(record, attempts, '', ''))
      end
    end
    redis.call('ZADD', store, due, id)
    if record then
      index_priority(store, id, record_priority(record), due)
      index_group(store, id, record_group(record, select(4, record_fields(record))), due)
    end
    if earliest == nil or due < earliest then earliest = due end
    journal(journal_key, journal_max_len, 'rescheduled', id, now, due, '')
    append(results, CODE.RESCHEDULED, due)
  end
end

if earliest then wake_if_earliest(store, wake, earliest) end
return results
