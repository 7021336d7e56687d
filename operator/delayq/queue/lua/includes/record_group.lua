--@include record_extras

-- The record's group: its 'g<length>:<group>' field, the last of the tagged fields (after the
-- priority: record_priority), or nil for a message without one (every message scheduled
-- without a group, and every older record). The length prefix lets a group hold any
-- printable text, ':' included. `p3` (record_fields) saves a parse; a record without tagged
-- fields (a digit after p3: its headers length) answers after one byte.
local function record_group(record, p3)
  local first = string.byte(record, p3 + 1)
  if first and first >= 48 and first <= 57 then return nil end
  local _, _, stop = record_extras(record, p3)
  if string.byte(record, stop + 1) == 112 then  -- 'p': the priority comes before
    stop = string.find(record, ':', stop + 2, true)
  end
  if string.byte(record, stop + 1) ~= 103 then return nil end  -- 'g'
  local ends = string.find(record, ':', stop + 2, true)
  return string.sub(record, ends + 1, ends + tonumber(string.sub(record, stop + 2, ends - 1)))
end
