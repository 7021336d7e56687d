#!lua flags=no-writes
--[[
  Depth and timing of one slot (read-only).

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  (and the slot's fair groups' round, named from its keys: includes/group_keys.lua)

  ARGV[1] groups   '1': count the fair groups too (/metrics); absent: not (the consumer's
                   watchdog reads every owned slot each second and needs only the heads)

  Returns {now_ms, scheduled, due, prepared, dead, next_due_ms, next_deadline_ms[, groups_due,
  groups_held, groups]}: `scheduled` counts all of store, `due` those already due and not yet
  claimed; next_* are -1 when empty. The last three when asked and the slot has fair groups.
  Of the groups with a message waiting (`groups`, as the
  round holds them: the claims drop a group whose last message left), `groups_due` are those
  whose turn has come by the claims' own rule (score <= group_turn(now): a message due, room
  under maxInFlightPerGroup as far as the claims know), `groups_held` those a claim found at
  maxInFlightPerGroup and parked. A ZCARD (all a slot without groups costs) and two ZCOUNTs:
  O(log groups) however many wait.

  Events: none
]]
--@include group_keys
--@include group_turn
--@include now_us

local store, prepare, dead = KEYS[1], KEYS[2], KEYS[3]
local now_micros = now_us()
local now = math.floor(now_micros / 1000)
local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
local answer = {
  now,
  redis.call('ZCARD', store),
  redis.call('ZCOUNT', store, '-inf', now),
  redis.call('ZCARD', prepare),
  redis.call('ZCARD', dead),
  head[2] and tonumber(head[2]) or -1,
  lease_head[2] and tonumber(lease_head[2]) or -1,
}
if ARGV[1] ~= '1' then return answer end
local _, groups = group_keys(store)
local grouped = redis.call('ZCARD', groups)
if grouped > 0 then
  answer[8] = redis.call('ZCOUNT', groups, '-inf', group_turn(now_micros))
  answer[9] = redis.call('ZCOUNT', groups, '+inf', '+inf')
  answer[10] = grouped
end
return answer
