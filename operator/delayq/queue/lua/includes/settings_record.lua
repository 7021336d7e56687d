-- The name of the slot's settings record (topic_settings) from any key of the slot: the
-- record is `dq-settings:` and the key's hash tag (queue/keys.py), same cluster slot.
local function settings_record(key)
  return 'dq-settings:' .. string.match(key, '^dq:({.-}):')
end
