-- The `groups` score of a group served by the claim at `now_micros` (the server clock in µs):
-- that instant in ms with its µs as the fraction, so that each claim call (one clock reading
-- each, and no two in the same µs) puts the groups it served behind every group served
-- before, even within one ms. 16 significant digits, exact in a double (ms up to 2^53 / 1000).
local function group_turn(now_micros)
  return string.format('%.3f', now_micros / 1000)
end
