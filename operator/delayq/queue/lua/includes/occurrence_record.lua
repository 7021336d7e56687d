--@include series_fields

-- The record of a new occurrence of the schedule whose value this is: no attempt yet, not
-- leased (record_fields), the schedule's headers and payload (the template after its definition).
local function occurrence_record(value)
  local p2 = select(4, series_fields(value))
  local p3 = string.find(value, ':', p2 + 1, true)
  local p4 = string.find(value, ':', p3 + 1, true)
  local definition_len = tonumber(string.sub(value, p3 + 1, p4 - 1))
  return '0:::' .. string.sub(value, p4 + 1 + definition_len)
end
