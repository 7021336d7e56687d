-- The slot's fair-group parts (docs/architecture.md, "Fair groups"; keys.Part GROUP_WAIT,
-- GROUPS, GROUP_LEASES), named from any key of the slot as the priority index is from store:
-- every script that moves a grouped message reaches them without one more declared key (no
-- script's KEYS changed for them). They exist only while the slot holds a grouped message, so
-- a topic without groups never has them.
--   wait    ZSET, every score 0: group_member(group, due, id) of each waiting grouped message,
--           so one group's messages are one lexical range in due order
--   groups  ZSET group -> the instant its next message may be claimed (its head's due, or the
--           last claim that served it: round-robin), '+inf' while at maxInFlightPerGroup
--   leases  ZSET, every score 0: group .. '\0' .. id of each leased grouped message
local function group_keys(key)
  local prefix = string.match(key, '^(dq:{.-}:)')
  return prefix .. 'groupwait', prefix .. 'groups', prefix .. 'groupleases'
end
