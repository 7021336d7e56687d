-- The lexical range of one group's members in `wait` or `leases`.
local function group_range(group)
  return '[' .. group .. '\0', '(' .. group .. '\1'
end
