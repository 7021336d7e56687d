-- The outcome remembered for an id (its `outcome` hash value, or false) if it finished within
-- the retention: state, finished ms, attempts; else nil (never finished, forgotten, or older
-- than the retention and not trimmed yet).
local function remembered(value, retention_ms, now)
  if not value or retention_ms <= 0 then return nil end
  local p1 = string.find(value, ':', 1, true)
  local p2 = string.find(value, ':', p1 + 1, true)
  local finished_ms = tonumber(string.sub(value, p1 + 1, p2 - 1))
  if finished_ms <= now - retention_ms then return nil end
  return string.sub(value, 1, p1 - 1), finished_ms, tonumber(string.sub(value, p2 + 1))
end
