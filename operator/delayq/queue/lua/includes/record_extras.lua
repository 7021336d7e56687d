--@include record_fields

-- The optional tagged fields between a record's lease and its headers length (layout:
-- record_fields): 'x<ms>' the instant the message expires (not delivered after it), 'f<ms>'
-- when its first delivery attempt was claimed (the start of the topic's retry.for). A headers
-- length starts with a digit, so a tag never reads as one. Returns expire_ms, first_ms
-- (numbers or nil) and the offset of the ':' ending the last of them (`p3` when none).
local function record_extras(record, p3)
  if p3 == nil then p3 = select(4, record_fields(record)) end
  local expire_ms, first_ms, stop = nil, nil, p3
  while true do
    local tag = string.sub(record, stop + 1, stop + 1)
    if tag ~= 'x' and tag ~= 'f' then break end
    local next_stop = string.find(record, ':', stop + 1, true)
    local value = tonumber(string.sub(record, stop + 2, next_stop - 1))
    if tag == 'x' then expire_ms = value else first_ms = value end
    stop = next_stop
  end
  return expire_ms, first_ms, stop
end
