-- The hash that picks an id's bucket (bucket_of): the first 32 bits of the id's SHA-1,
-- independent of the CRC32 that picks the id's slot, so a slot's ids spread over all its
-- buckets (queue/record_buckets.py computes alike).
local function id_hash(id)
  return tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
end
