--@include unpack_chunk

-- How many of `keys` exist (EXISTS, in chunks): a call over many slots asks once whether any
-- of them has a part at all (an empty hash or set does not exist), not once a slot.
local function existing_count(keys)
  local count = 0
  for i = 1, #keys, UNPACK_CHUNK do
    count = count + redis.call('EXISTS', unpack(keys, i, math.min(i + UNPACK_CHUNK - 1, #keys)))
  end
  return count
end
