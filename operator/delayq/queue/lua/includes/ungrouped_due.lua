--@include group_keys
--@include group_member
--@include read_chunked
--@include record_fields
--@include record_group

-- The last pass of a claim in a slot with groups: up to `room` messages of store already due
-- by `now`, in due order, but for those the earlier passes took (`seen`) and the grouped ones
-- their group's turn will take (those with their entry in `wait`: a grouped message without
-- one is taken here as any other, so store stays the truth and nothing waits for an entry it
-- lacks). Store is read a page at a time past such messages, at most `scan_max` of them: a
-- group's herd due before an ungrouped message holds it back no further than that (then the
-- herd drains in its group's turns first). Returns a flat {id, due, ...}.
local function ungrouped_due(store, msg, now, room, seen, scan_max)
  local wait = group_keys(store)
  local taken, offset = {}, 0
  while room > 0 and offset < scan_max do
    local page = redis.call('ZRANGEBYSCORE', store, '-inf', now, 'WITHSCORES', 'LIMIT', offset,
      math.min(room + 16, scan_max - offset))
    if #page == 0 then break end
    offset = offset + #page / 2
    local ids, dues = {}, {}
    for i = 1, #page, 2 do
      if not seen[page[i]] then
        ids[#ids + 1] = page[i]
        dues[#dues + 1] = page[i + 1]
      end
    end
    local records = read_chunked('HMGET', msg, ids)
    for k, id in ipairs(ids) do
      local record = records[k]
      local group = record and record_group(record, select(4, record_fields(record)))
      if room > 0 and not (group and redis.call('ZSCORE', wait, group_member(group, dues[k], id)))
      then
        taken[#taken + 1] = id
        taken[#taken + 1] = dues[k]
        room = room - 1
      end
    end
  end
  return taken
end
