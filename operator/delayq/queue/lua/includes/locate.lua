-- Where a message is: 'scheduled' | 'prepared' | 'dead' | false, with its score there.
local function locate(store, prepare, dead, id)
  local score = redis.call('ZSCORE', store, id)
  if score then return 'scheduled', tonumber(score) end
  score = redis.call('ZSCORE', prepare, id)
  if score then return 'prepared', tonumber(score) end
  score = redis.call('ZSCORE', dead, id)
  if score then return 'dead', tonumber(score) end
  return false, nil
end
