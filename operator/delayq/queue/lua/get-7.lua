#!lua flags=no-writes
--[[
  Read messages by id, atomically across the slot's keys (read-only). Refused with SLOT_MOVING
  while the slot is frozen for a move: after the move's clean step the source keeps only its
  frozen epoch, so a reader whose routing is stale would read every message as absent; it
  asks the slot's new broker instead, once its routing names it.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] outcome  HASH id -> remembered outcome of a finished message
  KEYS[7] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] outcome_retention_ms  0 = finished messages are not remembered (record)
  ARGV[2..] ids

  Returns, flat, per id: state, score_ms, record, reason: state 'scheduled' (score = due),
  'prepared' (score = lease deadline), 'dead' (score = time of death, reason set), for an id
  that finished within the retention 'done' | 'cancelled' | 'purged' (score = finished ms, the
  record holds only its attempts), else 'absent' (score -1, empty record and reason).

  Events: none
]]
--@include append
--@include locate
--@include now_ms
--@include refuse_if_moving
--@include remembered
--@include topic_settings

refuse_if_moving(KEYS[7])

local store, prepare, dead, msg, reason, outcome =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local retention_ms = tonumber(topic_settings(KEYS[1], {'outcome_retention_ms'}, {ARGV[1]}))
local now = now_ms()
local results = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local state, score = locate(store, prepare, dead, id)
  local finished_state, finished_ms, attempts = nil, nil, nil
  if not state then
    finished_state, finished_ms, attempts =
      remembered(redis.call('HGET', outcome, id), retention_ms, now)
  end
  if state then
    append(results, state, score, redis.call('HGET', msg, id) or '',
      redis.call('HGET', reason, id) or '')
  elseif finished_state then
    append(results, finished_state, finished_ms, attempts .. ':::0:', '')
  else
    append(results, 'absent', -1, '', '')
  end
end
return results
