--@include record_extras
--@include record_fields

-- The record with its first attempt's claim time `now` ('f' field, record_extras) unless it
-- has one: a retry keeps the time of the first attempt, the start of the topic's retry.for.
local function with_first_attempt(record, now)
  local p3 = select(4, record_fields(record))
  local _, first_ms = record_extras(record, p3)
  if first_ms then return record end
  return string.sub(record, 1, p3) .. 'f' .. now .. ':' .. string.sub(record, p3 + 1)
end
