-- The prefix of a slot's key names (`dq:{<tag>}:`) from its `store` key, which a call over
-- many slots declares alone for each of them (schedulemany-1): its other parts are that prefix
-- and their part name, in the same hash tag. A key that is not a slot's store key is refused
-- before anything is written.
local function slot_prefix(store_key)
  local prefix = string.match(store_key, '^(dq:{[^}]*}:)store$')
  if not prefix then error({err = 'ERR not a slot store key: ' .. store_key}) end
  return prefix
end
