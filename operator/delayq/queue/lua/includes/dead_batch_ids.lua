-- The ids a dead-letter call works on: mode 'oldest' takes up to max_count of the oldest dead,
-- mode 'ids' takes args[first..] as given (redrive-7 passes its ARGV, 4; purge-8 ARGV, 5).
local function dead_batch_ids(dead, mode, max_count, args, first)
  if mode == 'oldest' then
    return redis.call('ZRANGE', dead, 0, tonumber(max_count) - 1)
  end
  local ids = {}
  for i = first, #args do ids[#ids + 1] = args[i] end
  return ids
end
