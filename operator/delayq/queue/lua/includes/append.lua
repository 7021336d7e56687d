-- Append values to a flat reply. Every list reply is flat: a fixed-length head (maybe empty),
-- then one fixed-stride group per message or row, so no Lua table is built per message and
-- one parser (plans.py `_groups`) reads them all.
local function append(list, ...)
  local n = #list
  for i = 1, select('#', ...) do
    list[n + i] = (select(i, ...))
  end
end
