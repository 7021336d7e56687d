--@include priority_key
--@include priority_score

-- A message put into `store` at `due` with `priority` also enters the slot's priority index
-- when its priority is above 0 (priority_key), replacing any entry it had; with priority 0 it
-- costs nothing.
local function index_priority(store, id, priority, due)
  if priority > 0 then
    redis.call('ZADD', priority_key(store), priority_score(priority, due), id)
  end
end
