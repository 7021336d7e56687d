-- The values per message of a schedule call (schedule-10's ARGV[7]): 8, 9 with
-- priorities, or 10 with groups (and priorities). Anything else is refused (an error) before anything is written: the scripts step
-- through their messages by it, and a raw call's 0 (Lua 5.1's `for` with a step of 0 never
-- ends) would have the engine's own function block the broker, which the topic's Redis user
-- may call (docs/security.md, "Redis ACL users").
local function schedule_fields(value)
  local fields = tonumber(value)
  if fields ~= 8 and fields ~= 9 and fields ~= 10 then
    error({err = 'ERR values a message must be 8, 9 or 10, not ' .. string.sub(tostring(value), 1, 20)})
  end
  return fields
end
