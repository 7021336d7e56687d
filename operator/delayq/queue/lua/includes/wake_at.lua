-- Tell the slot's consumer that a message may be due at `due` (its integer text, server ms;
-- '1' for now): the slot's `wake` list, which the consumer's blocking wait pops, keeps an
-- element no later than `due`. A consumer times its next claim from the element it pops
-- (queue/slots.py), so a message scheduled ahead costs no claim until it is due, where a bare
-- wake-up cost one claim a slot at once (a producer's first batch over 1,024 slots: 1,024
-- claims of nothing). The list holds one element, or a few while nobody pops it (a hand-back,
-- an older version's '1'); an element that is not a number means now. Only LRANGE, DEL and
-- RPUSH, which the topic's service user already has (queue/acl.py): no ACL change to
-- upgrade.
local function wake_at(wake, due)
  local held = redis.call('LRANGE', wake, '0', '-1')
  local at = tonumber(due)
  for _, element in ipairs(held) do
    if (tonumber(element) or 0) <= at then return end
  end
  if #held > 0 then redis.call('DEL', wake) end
  redis.call('RPUSH', wake, due)
end
