-- A priority index entry's score: the priority's band of 2^42 ms (139 years, past any due time
-- a schedule accepts) plus the due ms, so each priority's due entries are one score range.
-- Formatted as an integer: redis.call would write a Lua number with 14 significant digits.
local function priority_score(priority, due)
  return string.format('%d', priority * 4398046511104 + due)
end
