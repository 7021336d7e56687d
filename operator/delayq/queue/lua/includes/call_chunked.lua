--@include unpack_chunk

-- A variadic command (ZADD, HSET, ZREM, HDEL) in chunks, so a large batch never exceeds Lua's
-- unpack limit.
local function call_chunked(command, key, args)
  for i = 1, #args, UNPACK_CHUNK do
    redis.call(command, key, unpack(args, i, math.min(i + UNPACK_CHUNK - 1, #args)))
  end
end
