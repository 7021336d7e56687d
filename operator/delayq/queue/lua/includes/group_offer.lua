--@include group_range
--@include read_chunked

-- What one group offers a claim (due_by_group): up to `allowed` of its messages already due
-- by `now`, in due order, as a flat {id, due, ...}, but those in `skip`. Each entry of `wait`
-- is checked against store, whose score is the truth: one whose message left store or waits
-- at another due is dropped (whoever moved it indexed it anew), and the group's entries are
-- read on past those, a page at a time, at most 8 pages: cancelled messages' entries hold no
-- claim back.
local function group_offer(store, wait, group, now, allowed, skip)
  local offer, count = {}, 0
  local low, high = group_range(group)
  for _ = 1, 8 do
    local entries = redis.call('ZRANGEBYLEX', wait, low, high, 'LIMIT', 0, allowed - count)
    if #entries == 0 then break end
    local ids, dues = {}, {}
    for k, entry in ipairs(entries) do
      local due, id = string.match(entry, '%z(%d+)%z(.*)$', #group + 1)
      ids[k], dues[k] = id, tonumber(due)
    end
    local scores = read_chunked('ZMSCORE', store, ids)
    local dropped, waiting = 0, false
    for k, id in ipairs(ids) do
      local score = tonumber(scores[k])
      if score ~= dues[k] then
        redis.call('ZREM', wait, entries[k])
        dropped = dropped + 1
      elseif score > now then
        waiting = true
      elseif not skip[id] then
        offer[#offer + 1] = id
        offer[#offer + 1] = score
        count = count + 1
      end
    end
    if dropped == 0 or waiting or count >= allowed then break end
  end
  return offer
end
