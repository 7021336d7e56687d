-- The record of a message scheduled anew: no attempt yet, not leased, its expiry instant when
-- it has one, its priority when above 0 and its group when it has one, the last tagged fields
-- (layout: record_fields, record_extras, record_priority, record_group). The instant is
-- formatted with %d:
-- Lua's own number-to-string writes 15 digits or more as '4.5035996273705e+15', which no
-- integer parser reads (expire_at_ms goes up to 2^52); and %d is an integer's printf, where
-- tostring formats a double (a producer's every message comes here).
local function new_record(headers, payload, expire_ms, priority, group)
  local extras = ''
  if expire_ms then extras = 'x' .. string.format('%d', expire_ms) .. ':' end
  if priority > 0 then extras = extras .. 'p' .. string.format('%d', priority) .. ':' end
  if group then extras = extras .. 'g' .. #group .. ':' .. group end
  return '0:::' .. extras .. string.format('%d', #headers) .. ':' .. headers .. payload
end
