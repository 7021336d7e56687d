#!lua flags=no-writes
--[[
  Read one slot's settings record (queue/topic_record.py): its owner publishes only into the
  slots whose record differs, so an unchanged topic costs its owner reads only, which a master
  whose writes are paused (a switchover's CLIENT PAUSE WRITE) or refused (minReplicasToWrite)
  still answers.

  The answer is bounded: the owner (the operator) reads every slot of every broker on every
  pass, and whoever holds a broker's admin login (the topic's Secret has it) may have grown a
  record to any size. A record no publisher writes (more than 64 fields, or a field or value
  longer than 256 bytes) is answered as none, so its owner writes it again whole.

  KEYS[1] settings  HASH field -> value: 'owner', 'version' and the topic's settings

  ARGV: none

  Returns the record as a flat list: field, value, ... (empty when the slot has none, or one
  no publisher writes).

  Events: none
]]

if redis.call('HLEN', KEYS[1]) > 64 then return {} end
local record = redis.call('HGETALL', KEYS[1])
for i = 1, #record do
  if #record[i] > 256 then return {} end
end
return record
