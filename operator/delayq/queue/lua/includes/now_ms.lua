--@include now_us

-- The server clock in whole milliseconds, the unit of due times, deadlines and epochs.
local function now_ms()
  return math.floor(now_us() / 1000)
end
