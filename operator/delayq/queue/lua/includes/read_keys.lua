--@include unpack_chunk

-- The values of many string keys (MGET, in chunks), in order: a call over many slots reads
-- each slot's epoch in one command, not one a slot.
local function read_keys(keys)
  local out = {}
  for i = 1, #keys, UNPACK_CHUNK do
    local part = redis.call('MGET', unpack(keys, i, math.min(i + UNPACK_CHUNK - 1, #keys)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
