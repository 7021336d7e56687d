-- The server clock (TIME) in microseconds: every script's notion of now.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
