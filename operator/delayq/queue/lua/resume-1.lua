#!lua flags=allow-oom
--[[
  Undo a pause set with a holder's mark (Queue.pause_as: the flag's value is the holder's name)
  while the mark is still that holder's: `delayq pipeline restore --replay` resumes only the
  brokers it paused. A pause set over it since (the API, the operator's spec.delivery.paused: the
  value "1") or a resume is left as it is. One script, so no pause can come between the check
  and the delete (GET then DEL from the client undid a pause set in between).

  KEYS[1] paused  STRING the topic's pause flag on this broker (keys.paused_key)

  ARGV[1] holder  the mark pause_as set

  Returns 1 when it resumed, 0 when the flag was not the holder's (absent, or another's).

  Runs under maxmemory (allow-oom): it only deletes a key.

  Events: none
]]

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
