-- The record of a message scheduled anew: no attempt yet, not leased (layout: record_fields).
local function new_record(headers, payload)
  return '0:::' .. tostring(#headers) .. ':' .. headers .. payload
end
