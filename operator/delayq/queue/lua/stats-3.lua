#!lua flags=no-writes
--[[
  Depth and timing of one slot or of several slots of one broker (read-only): the consumer's
  watchdog reads every slot it owns on a broker in one call a second, not one call per slot
  (at 1,024 slots that was ~1,000 calls a second on an idle topic). One slot's reply is what it
  always was.

  KEYS[1] store    ZSET id -> due ms            (then again per further slot: KEYS[3k + 1])
  KEYS[2] prepare  ZSET id -> lease deadline ms (KEYS[3k + 2])
  KEYS[3] dead     ZSET id -> time of death ms  (KEYS[3k + 3])
  (and each slot's fair groups' round, named from its keys: includes/group_keys.lua)

  ARGV[1] groups   '1': count the fair groups too (/metrics); absent: not (the consumer's
                   watchdog reads every owned slot each second and needs only the heads)

  Returns {now_ms, then per slot: scheduled, due, prepared, dead, next_due_ms,
  next_deadline_ms[, groups_due, groups_held, groups]}: `scheduled` counts all of store, `due`
  those already due and not yet claimed (estimated in a slot whose due times are in buckets
  once more than 32 of them hold a due one: lua/includes/store_buckets.lua,
  `estimated_count`); next_* are -1 when empty. All slots are read at the
  same `now_ms`. The last three when asked (0 for a slot without fair groups). Of the groups
  with a message waiting (`groups`, as the round holds them: the claims drop a group whose
  last message left), `groups_due` are those whose turn has come by the claims' own rule
  (score <= group_turn(now): a message due, room under maxInFlightPerGroup as far as the
  claims know), `groups_held` those a claim found at maxInFlightPerGroup and parked. A ZCARD
  (all a slot without groups costs) and two ZCOUNTs: O(log groups) however many wait.

  Events: none
]]
--@include group_keys
--@include group_turn
--@include now_us

local now_micros = now_us()
local now = math.floor(now_micros / 1000)
local with_groups = ARGV[1] == '1'
local out = {now}
for i = 1, #KEYS, 3 do
  local store, prepare = KEYS[i], KEYS[i + 1]
  local head = redis.call('ZRANGE', store, 0, 0, 'WITHSCORES')
  local lease_head = redis.call('ZRANGE', prepare, 0, 0, 'WITHSCORES')
  local next_due = head[2] and tonumber(head[2])
  local next_deadline = lease_head[2] and tonumber(lease_head[2])
  -- an empty set or a head not due yet answers its count without asking (most slots idle)
  out[#out + 1] = next_due and redis.call('ZCARD', store) or 0
  out[#out + 1] = next_due and next_due <= now and redis.estimated_count(store, '-inf', now) or 0
  out[#out + 1] = next_deadline and redis.call('ZCARD', prepare) or 0
  out[#out + 1] = redis.call('ZCARD', KEYS[i + 2])
  out[#out + 1] = next_due or -1
  out[#out + 1] = next_deadline or -1
  if with_groups then
    local _, groups = group_keys(store)
    local grouped = redis.call('ZCARD', groups)
    out[#out + 1] = grouped > 0 and redis.call('ZCOUNT', groups, '-inf', group_turn(now_micros)) or 0
    out[#out + 1] = grouped > 0 and redis.call('ZCOUNT', groups, '+inf', '+inf') or 0
    out[#out + 1] = grouped
  end
end
return out
