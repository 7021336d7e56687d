--@include bucket_of

-- The positions first, first + stride, ... of `args` (ids) grouped by their bucket among `n`
-- (bucket_of of `hash_of(id)`, the caller's cached id_hash): bucket -> positions, and the
-- buckets in the order they first appear. What both bucketed parts (record_buckets,
-- store_buckets) send a command per bucket by.
local function bucket_groups(args, first, stride, n, hash_of)
  local groups, order = {}, {}
  local low = 1
  while low * 2 <= n do low = low * 2 end
  for i = first, #args, stride do
    local b = bucket_of(hash_of(args[i]), n, low)
    local group = groups[b]
    if not group then
      group = {}
      groups[b] = group
      order[#order + 1] = b
    end
    group[#group + 1] = i
  end
  return groups, order
end
