-- The record of a message scheduled anew: no attempt yet, not leased, and its expiry instant
-- when it has one (layout: record_fields, record_extras).
local function new_record(headers, payload, expire_ms)
  local extras = ''
  if expire_ms then extras = 'x' .. expire_ms .. ':' end
  return '0:::' .. extras .. tostring(#headers) .. ':' .. headers .. payload
end
