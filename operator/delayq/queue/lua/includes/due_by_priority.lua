--@include priority_key
--@include priority_score
--@include read_chunked

-- The first pass of a claim: up to `max_count` messages of the slot's priority index already
-- due by `now` (never one that is early), the highest priority first and equal ones in due
-- order, as a flat {id, due, ...} like store's ZRANGEBYSCORE WITHSCORES. They stay in store
-- and the index: the claim fills the rest of its batch from store in due order and removes
-- from both only what it takes (its byte bound may stop before the last of them). Each
-- entry is checked against store, whose score is the truth: an entry whose message left store
-- (cancelled, replaced, claimed by another path) is dropped, one whose message waits for a
-- later due is entered again at it. Returns {} after one EXISTS when the slot has no index,
-- at once when the caller knows it has none (`absent`).
local function due_by_priority(store, now, max_count, absent)
  local key = priority_key(store)
  local taken, ids = {}, {}
  if absent or max_count <= 0 or redis.call('EXISTS', key) == 0 then return taken end
  for priority = 9, 1, -1 do
    local room = max_count - #ids
    if room <= 0 then break end
    local entries = redis.call('ZRANGEBYSCORE', key, priority_score(priority, 0),
      priority_score(priority, now), 'LIMIT', 0, room)
    if #entries > 0 then
      local dues = read_chunked('ZMSCORE', store, entries)
      for k, id in ipairs(entries) do
        local due = tonumber(dues[k])
        if due and due <= now then
          ids[#ids + 1] = id
          taken[#taken + 1] = id
          taken[#taken + 1] = due
        elseif due then
          redis.call('ZADD', key, priority_score(priority, due), id)
        else
          redis.call('ZREM', key, id)
        end
      end
    end
  end
  return taken
end
