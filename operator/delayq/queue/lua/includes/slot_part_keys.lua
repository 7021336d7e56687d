-- One slot's keys `prefix .. part` in the order of `parts` (a one-slot script's KEYS order),
-- for the body a call over several slots runs slot after slot.
local function slot_part_keys(prefix, parts)
  local keys = {}
  for i = 1, #parts do keys[i] = prefix .. parts[i] end
  return keys
end
