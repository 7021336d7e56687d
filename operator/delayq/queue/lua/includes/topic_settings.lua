--@include settings_record

-- The topic's settings a call obeys (queue/topic_record.py): each field of the slot's settings
-- record, which the topic's owner publishes and the topic's users may only read, wins over the
-- value the caller passed; a field the record lacks (no record yet: an operator of the previous
-- version, or a topic nobody published) keeps the caller's. `key` is any key of the slot: the
-- record is settings_record's, same cluster slot. It is not
-- among the script's KEYS because FCALL takes every key it is given as written to, and the
-- topic's users may not write the record (queue/acl.py). `fields` names the record's fields
-- and `given` holds the caller's values, in order; returns the values in that order.
-- The same read tells the wrappers whether the slot writes its records and its waiting
-- messages into buckets (lua/includes/record_buckets.lua, store_buckets.lua), so a write does
-- not ask the record again.
local function topic_settings(key, fields, given)
  local stored = redis.call('HMGET', settings_record(key), 'redis_record_buckets',
    'redis_store_buckets', 'redis_store_buckets_after_ms', unpack(fields))
  local prefix = string.match(key, '^(dq:{.-}:)')
  redis.note_layout(prefix .. 'msg', prefix .. 'store', stored[1], stored[2], stored[3])
  for i = 1, #fields do
    if stored[i + 3] then given[i] = stored[i + 3] end
  end
  return unpack(given)
end
