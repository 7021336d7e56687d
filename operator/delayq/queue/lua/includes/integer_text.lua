-- `n` as the text Redis would make of it, made cheaply: Redis 7.0 writes a Lua number given to
-- redis.call with "%.17g", a double's printf (a few hundred ns for a time in ms), where a whole
-- number's integer text is an integer's printf. Any other number (hostile: fractional, or
-- beyond the doubles' exact integers, which %d would not write as they are) is returned as it
-- is, for Redis to write as before.
local function integer_text(n)
  if n % 1 == 0 and n > -2^53 and n < 2^53 then return string.format('%d', n) end
  return n
end
