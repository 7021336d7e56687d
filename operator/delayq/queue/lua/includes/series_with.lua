--@include series_fields

-- The schedule's value with new `current` and `next` fields (layout: series_fields).
local function series_with(value, current, nxt)
  local p2 = select(4, series_fields(value))
  return current .. ':' .. nxt .. string.sub(value, p2)
end
