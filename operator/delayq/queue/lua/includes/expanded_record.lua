-- The record a bucket of records holds as `value` (compacted_record undone); false (absent)
-- stays false.
local function expanded_record(value)
  if value and string.byte(value, 1) == 46 then return '0:::0:' .. string.sub(value, 2) end
  return value
end
