--[[
  Read messages by id, atomically across the slot's keys (read-only).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason

  ARGV[1..] ids

  Returns, flat, per id: state, score_ms, record, reason: state 'scheduled' (score = due),
  'prepared' (score = lease deadline), 'dead' (score = time of death, reason set) or 'absent'
  (score -1, empty record and reason).

  Events: none
]]
--@include append
--@include locate

local store, prepare, dead, msg, reason = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local results = {}
for i = 1, #ARGV do
  local id = ARGV[i]
  local state, score = locate(store, prepare, dead, id)
  if state then
    append(results, state, score, redis.call('HGET', msg, id) or '',
      redis.call('HGET', reason, id) or '')
  else
    append(results, 'absent', -1, '', '')
  end
end
return results
