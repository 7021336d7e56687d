--@include record_extras
--@include record_fields

-- The record without its expiry and first-attempt fields (record_extras): a redriven message
-- starts afresh, as if scheduled now without an expiry.
local function without_extras(record)
  local p3 = select(4, record_fields(record))
  local _, _, stop = record_extras(record, p3)
  return string.sub(record, 1, p3) .. string.sub(record, stop + 1)
end
