--@include record_extras

-- The record's priority: its 'p<1..9>' field, the last of the tagged fields (after the expiry
-- and the first attempt: record_extras, whose `stop` it starts from; computed when nil), or 0
-- when it has none (every message scheduled without a priority, and every older record).
local function record_priority(record, stop)
  if stop == nil then stop = select(3, record_extras(record)) end
  if string.byte(record, stop + 1) ~= 112 then return 0 end  -- 'p'
  local ends = string.find(record, ':', stop + 2, true)
  return tonumber(string.sub(record, stop + 2, ends - 1))
end
