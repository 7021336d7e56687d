-- Variadic commands go in chunks of this many arguments, below Lua's unpack limit.
local UNPACK_CHUNK = 1000
