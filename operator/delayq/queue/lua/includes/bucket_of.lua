-- The linear hashing both bucketed parts of a slot share (record_buckets, store_buckets;
-- queue/record_buckets.py computes alike): the bucket of hash h (id_hash) among n buckets.
-- With 2^L <= n < 2^(L+1), a hash whose h mod 2^L is below n - 2^L lives in bucket
-- h mod 2^(L+1), every other one in h mod 2^L: growing n by one splits one bucket, n - 2^L,
-- and only towards the new one. `low` is 2^L when the caller knows it (bucket_groups, for
-- many ids under one n), else found here.
local function bucket_of(h, n, low)
  if not low then
    low = 1
    while low * 2 <= n do low = low * 2 end
  end
  local b = h % low
  if b < n - low then b = h % (low * 2) end
  return b
end
