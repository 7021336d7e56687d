-- A recurring schedule's value in the slot's `schedules` hash (queue/schedules.py packs it):
--   "<current_due_ms>:<next>:<catch_up>:<definition_len>:" .. definition_json .. template
-- `current` is the occurrence materialised last, `next` its precomputed successor ('' while a
-- top-up is owed, 'end' after the last occurrence), `template` the tail of an occurrence's
-- record ("<headers_len>:" .. headers .. payload).
--
-- current (string), next (string), catch_up ('once' | 'all' | 'skip'), and the offset of the
-- ':' that ends `next`
local function series_fields(value)
  local p1 = string.find(value, ':', 1, true)
  local p2 = string.find(value, ':', p1 + 1, true)
  local p3 = string.find(value, ':', p2 + 1, true)
  return string.sub(value, 1, p1 - 1), string.sub(value, p1 + 1, p2 - 1),
    string.sub(value, p2 + 1, p3 - 1), p2
end
