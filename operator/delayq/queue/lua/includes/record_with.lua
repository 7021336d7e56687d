--@include record_fields

-- The record with new attempts, due and lease fields; `p3` (from record_fields) saves a parse.
local function record_with(record, attempts, due, lease, p3)
  if p3 == nil then p3 = select(4, record_fields(record)) end
  return tostring(attempts) .. ':' .. due .. ':' .. lease .. string.sub(record, p3)
end
