#!lua flags=no-writes
--[[
  Read one slot's settings record (queue/topic_record.py): its owner publishes only into the
  slots whose record differs, so an unchanged topic costs its owner reads only, which a master
  whose writes are paused (a switchover's CLIENT PAUSE WRITE) or refused (minReplicasToWrite)
  still answers.

  KEYS[1] settings  HASH field -> value: 'owner', 'version' and the topic's settings

  ARGV: none

  Returns the record as a flat list: field, value, ... (empty when the slot has none).

  Events: none
]]

return redis.call('HGETALL', KEYS[1])
