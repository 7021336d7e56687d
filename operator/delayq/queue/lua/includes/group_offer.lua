--@include group_range
--@include read_chunked

-- What one group offers a claim (due_by_group): up to `allowed` of its messages already due
-- by `now`, in due order, as a flat {id, due, ...}, from the `offset`-th of its live entries
-- in `wait` on (what an earlier offer of this claim read), but those in `skip`. Each entry is
-- checked against store, whose score is the truth: one whose message left store or waits at
-- another due is dropped (whoever moved it indexed it anew), and the group's entries are read
-- on past those and the skipped ones, a page at a time, at most 8 pages: cancelled messages'
-- entries hold no claim back. Returns the offer, how many live entries it read in all (the
-- next offset) and whether the group may have more due (it offered all it was allowed).
local function group_offer(store, wait, group, now, allowed, skip, offset)
  local offer, count, kept = {}, 0, offset
  local low, high = group_range(group)
  for _ = 1, 8 do
    local asked = allowed - count
    local entries = redis.call('ZRANGEBYLEX', wait, low, high, 'LIMIT', kept, asked)
    if #entries == 0 then break end
    local ids, dues = {}, {}
    for k, entry in ipairs(entries) do
      local due, id = string.match(entry, '%z(%d+)%z(.*)$', #group + 1)
      ids[k], dues[k] = id, tonumber(due)
    end
    local scores = read_chunked('ZMSCORE', store, ids)
    local waiting = false
    for k, id in ipairs(ids) do
      local score = tonumber(scores[k])
      if score ~= dues[k] then
        redis.call('ZREM', wait, entries[k])
      elseif score > now then
        waiting = true
        break
      else
        kept = kept + 1
        if not skip[id] then
          offer[#offer + 1] = id
          offer[#offer + 1] = score
          count = count + 1
        end
      end
    end
    if waiting or count >= allowed or #entries < asked then
      return offer, kept, count >= allowed
    end
  end
  return offer, kept, count >= allowed
end
