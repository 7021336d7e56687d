--@include existing_count
--@include read_keys
--@include slot_prefix

-- What a call over several slots of one broker (schedulemany-1, claimmany-1, ackmany-1) asks
-- once for all of them, from their declared `store` keys (a slot may come twice): asked slot
-- by slot, each question was a command a slot. Returns each slot's key prefix (slot_prefix: a
-- key that is no slot's store key is refused here, before anything is written), its `epoch`
-- key and that key's value as read (false: unset), and `absent[part]` true when no slot has
-- that part of `sparse` at all (one EXISTS over all of them). The doubling's change tracking
-- and the buckets' lookups are told these are the call's slots (untracked_slots,
-- unbucketed_slots: one EXISTS each for all).
local function slots_header(stores, sparse)
  local prefixes, epoch_keys = {}, {}
  for s = 1, #stores do
    prefixes[s] = slot_prefix(stores[s])
    epoch_keys[s] = prefixes[s] .. 'epoch'
  end
  local epochs = read_keys(epoch_keys)
  local absent = {}
  for _, part in ipairs(sparse) do
    local keys = {}
    for s = 1, #prefixes do keys[s] = prefixes[s] .. part end
    absent[part] = existing_count(keys) == 0
  end
  redis.untracked_slots(stores, 1, 1)
  redis.unbucketed_slots(stores, 1, 1)
  return prefixes, epoch_keys, epochs, absent
end
