--[[
  Take over a slot: bump its fencing epoch. From this call on, every claim, ack, nack or extend
  carrying an older epoch is refused, so a former owner cut off by a partition can move nothing.

  KEYS[1] epoch  STRING fencing epoch of the slot owner

  ARGV: none

  Returns the new epoch (an integer >= 1).

  Events: none
]]

return redis.call('INCR', KEYS[1])
