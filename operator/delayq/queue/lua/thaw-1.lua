#!lua flags=allow-oom
--[[
  Undo freeze-1: the slot's epoch is its number again and the slot takes writes. The mover
  thaws the copy on the target broker before routing switches to it, and the source when it
  rolls a move back. Idempotent: a slot that is not frozen stays as it is.

  KEYS[1] epoch  STRING fencing epoch of the slot owner

  ARGV: none

  Returns the slot's epoch (an integer, 0 when it never had an owner).

  Runs under maxmemory (allow-oom), as freeze-1.

  Events: none
]]

local current = redis.call('GET', KEYS[1]) or '0'
if string.sub(current, 1, 7) ~= 'moving:' then
  return tonumber(current)
end
local epoch = string.sub(current, 8)
if epoch == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], epoch)
end
return tonumber(epoch)
