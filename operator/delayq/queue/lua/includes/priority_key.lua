-- The slot's priority index (`priority`: ZSET id -> priority_score of a waiting message whose
-- priority is above 0; docs/architecture.md, "Priority"), named from the slot's store key as
-- the settings record is from its tag: every script that puts a message into store or takes
-- one out reaches it without one more declared key (no script's KEYS changed for it). It
-- exists only while the slot holds such a message, so a topic without priorities pays one
-- EXISTS per claim for it.
local function priority_key(store)
  return string.sub(store, 1, -6) .. 'priority'
end
