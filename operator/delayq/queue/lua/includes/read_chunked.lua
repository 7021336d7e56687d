--@include unpack_chunk

-- A multi-key read (HMGET, ZMSCORE) over many members in chunks, as one flat list in order:
-- one Redis call per chunk instead of one per message keeps the hot scripts' cost in C.
local function read_chunked(command, key, members)
  local out = {}
  for i = 1, #members, UNPACK_CHUNK do
    local part = redis.call(command, key, unpack(members, i, math.min(i + UNPACK_CHUNK - 1, #members)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
