#!lua flags=allow-oom
--[[
  Take over a slot: raise its fencing epoch. From this call on, every claim, ack, nack, extend or
  give-back carrying an older epoch is refused, so a former owner cut off by a partition can move
  nothing.

  The new epoch is the larger of the old one + 1 and the server clock in ms: epochs keep rising
  even when a Redis failover or an `everysec` AOF loses the last increments, so an epoch (and
  with it a lease token) handed out before such a loss is never handed out again.

  KEYS[1] epoch  STRING fencing epoch of the slot owner; 'moving:<epoch>' while the slot moves

  ARGV: none

  Returns the new epoch (an integer >= 1); a slot being moved to another broker (frozen by
  freeze-1) raises a SLOT_MOVING error instead: its owner takes it over on the new broker.

  Runs under maxmemory (allow-oom): one small string, and a full Redis must still let a slot
  change owner (its messages would otherwise wait for memory to be freed by hand).

  Events: none
]]
--@include refuse_if_moving

refuse_if_moving(KEYS[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = math.max((tonumber(redis.call('GET', KEYS[1])) or 0) + 1, now)
redis.call('SET', KEYS[1], epoch)
return epoch
