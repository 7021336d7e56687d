-- A slot's message count in a call over several slots (schedulemany-1, ackmany-1), checked
-- before anything is written: its `per` values a message from ARGV[`first`] on must be among
-- the call's `total` arguments. A raw call's count past them (the topic's Redis user may call
-- the engine's functions: docs/security.md, "Redis ACL users") looped over absent arguments
-- for hours, the call's earlier slots written, so that not even FUNCTION KILL stopped it.
local function slot_count(value, first, per, total)
  local count = tonumber(value)
  if not count or count < 0 or count % 1 ~= 0 or first + per * count - 1 > total then
    error({err = "ERR a slot's message count past its arguments: " ..
      string.sub(tostring(value), 1, 20)})
  end
  return count
end
