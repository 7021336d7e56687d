#!lua flags=allow-oom
--[[
  Publish the topic's settings into one slot's settings record (queue/topic_record.py), which
  the transitions read in place of their callers' values. Only the topic's owner may: the
  operator as its admin user, or `delayq serve` on a Redis of its own; the topic's users may
  call it, but Redis refuses them the writes (their ACL may only read the record).

  A record is replaced when it is absent, names another owner (a topic deleted and made again
  under its name), or holds a version at most the given one and other values; one of the same
  owner with a newer version stays, so a publisher with stale settings never undoes a newer
  publication. Equal values are not written again (a publisher repeats itself every pass).

  `redis_record_buckets` and `redis_store_buckets` stay once written, 'False' when the
  publication does not give them: the scripts look for a slot's records and waiting messages
  in buckets only where the record has the field (lua/includes/record_buckets.lua,
  store_buckets.lua), and a slot that had buckets may hold messages in them long after the
  topic turned them off. So the owner gives each field only while the topic has those buckets
  on (queue/topic_record.py), and topics that never had them never pay the lookup. Kept when
  another owner replaces the record as well: whoever publishes, the slot's keys may still be
  those written under the old record.

  KEYS[1] settings  HASH field -> value: 'owner', 'version' and the topic's settings

  ARGV[1] owner     who publishes: the DelayTopic's uid, or 'delayq-serve'
  ARGV[2] version   the settings' version (the DelayTopic's generation, or the ms a serve
                    process read them)
  ARGV[3 + 2k], ARGV[4 + 2k]  per setting: its field, its value

  Returns the version the record holds after the call (an integer): the given one when it was
  written or already so, a newer one it kept.

  Runs under maxmemory (allow-oom): one small hash, and a full broker must still take the
  topic's settings (a lower quota is what lets it drain).

  Events: none
]]

local settings, owner, version = KEYS[1], ARGV[1], tonumber(ARGV[2])
local LAYOUT_FIELDS = {'redis_record_buckets', 'redis_store_buckets'}
local stored = redis.call('HMGET', settings, 'owner', 'version', unpack(LAYOUT_FIELDS))
local given = {unpack(ARGV, 3)}
local named = {}
for i = 1, #given, 2 do named[given[i]] = true end
for k, field in ipairs(LAYOUT_FIELDS) do
  if stored[2 + k] and not named[field] then
    given[#given + 1] = field
    given[#given + 1] = 'False'
  end
end
if stored[1] == owner and stored[2] then
  local stored_version = tonumber(stored[2])
  if stored_version > version then return stored_version end
  if stored_version == version then
    local names = {}
    for i = 1, #given, 2 do names[#names + 1] = given[i] end
    local values = redis.call('HMGET', settings, unpack(names))
    local same = redis.call('HLEN', settings) == #names + 2
    for i = 1, #names do
      if values[i] ~= given[2 * i] then same = false end
    end
    if same then return version end
  end
end
redis.call('DEL', settings)
redis.call('HSET', settings, 'owner', owner, 'version', ARGV[2], unpack(given))
return version
