--[[
  Schedule messages into one slot: create-only (Dyno-queues' `ensure`) or upsert (replace).
  Create-only also refuses an id that finished within the topic's outcome retention, so a
  producer's retry (or a re-run ingest) after its message fired does not fire it again.

  KEYS[1] store    ZSET id -> due ms
  KEYS[2] prepare  ZSET id -> lease deadline ms
  KEYS[3] dead     ZSET id -> time of death ms
  KEYS[4] msg      HASH id -> record
  KEYS[5] reason   HASH id -> dead reason
  KEYS[6] wake     LIST wake-up marker of the slot
  KEYS[7] journal  STREAM lifecycle events
  KEYS[8] outcome  HASH id -> remembered outcome of a finished message
  KEYS[9] epoch    STRING fencing epoch; 'moving:<epoch>' while the slot moves (refused)
  KEYS[10] basis   HASH id -> custom slot basis (only messages scheduled with one)
  (and the slot's settings record, by its hash tag: topic_settings; its fields win over the
  ARGV values marked (record), which stay the fallback while it lacks them)

  ARGV[1] mode                  'create' | 'upsert'
  ARGV[2] max_delay_ms          due times beyond server now + this are refused
  ARGV[3] journal_max_len       0 = journal off (record)
  ARGV[4] outcome_retention_ms  0 = finished messages are not remembered (record)
  ARGV[5] expiry_ttl_ms         the topic's default: a message without its own expiry expires
                                this long after its due time (0 = never) (record)
  ARGV[6] max_pending           the slot's share of the topic's limits.maxPending: a new
                                message beyond this many scheduled + prepared is refused
                                (0 = no limit) (record: field limits_max_pending)
  ARGV[7 + 8k .. 14 + 8k]       per message: id, when_kind ('delay' | 'at'), when_ms,
                                expire_kind ('' | 'at' | 'ttl': after the due time),
                                expire_ms, headers, payload, slot basis ('' = its id: no
                                entry in `basis`); a message stored (created or replaced)
                                gets the entry of the basis it is stored with, or none

  Returns a flat array, per message in order the triple code, due_ms, state:
     1 CREATED   scheduled anew at due_ms                       state 'scheduled'
     2 EXISTS    create mode: the live message is left as it is state and due_ms of that message
     6 ALREADY_DONE create mode: the id finished within the   state 'done' | 'cancelled' |
                 retention; nothing was scheduled            'purged', due_ms = finished ms
     3 UPDATED   upsert: the message was replaced, due moved    state 'scheduled'
    -4 TOO_FAR   due beyond now + max_delay_ms, nothing changed due_ms = the refused due
    -7 EXPIRES_BEFORE_DUE  its expiry is not after its due    due_ms = the refused due
                 time: it could never be delivered, nothing changed
    -8 OVER_QUOTA a new message beyond max_pending,          due_ms = the refused due
                 nothing changed (replacing a live one is not refused)

  Events: scheduled (new or replaced)
]]
--@include append
--@include call_chunked
--@include codes
--@include journal
--@include locate
--@include new_record
--@include now_ms
--@include read_chunked
--@include record_fields
--@include refuse_if_moving
--@include remembered
--@include topic_settings
--@include wake_if_earliest

refuse_if_moving(KEYS[9])

local store, prepare, dead, msg, reason, wake, journal_key, outcome, basis =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[10]
local upsert = ARGV[1] == 'upsert'
local max_delay_ms = tonumber(ARGV[2])
local journal_max_len, retention_ms, default_ttl_ms, max_pending = topic_settings(KEYS[1],
  {'journal_max_len', 'outcome_retention_ms', 'expiry_ttl_ms', 'limits_max_pending'},
  {ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
journal_max_len, retention_ms = tonumber(journal_max_len), tonumber(retention_ms)
default_ttl_ms, max_pending = tonumber(default_ttl_ms), tonumber(max_pending)
local now = now_ms()

local results = {}
local zadd_args, hset_args = {}, {}
-- id -> the slot basis it is stored with, or false to delete an entry it may have (of the
-- message it replaces, or of a finished one kept with its outcome: forget_bases), looked for
-- only in a slot that has entries, so default-basis batches pay nothing; written after the
-- loop, so the last of an id given twice in the batch wins
local has_bases = redis.call('HLEN', basis) > 0
local bases, based_ids = {}, {}
local pending = {}  -- id -> due, for ids scheduled earlier in this same batch
local earliest = nil

-- a live message always has its record: one HMGET tells which ids exist (new ids cost no copy)
local ids = {}
for i = 7, #ARGV, 8 do ids[#ids + 1] = ARGV[i] end
local pending_count = nil  -- scheduled + prepared, counted when a limit is set
if max_pending > 0 then
  pending_count = redis.call('ZCARD', store) + redis.call('ZCARD', prepare)
end
local records = read_chunked('HMGET', msg, ids)
-- create-only asks what finished ids left behind; upsert replaces whatever there was
local outcomes = {}
if retention_ms > 0 and not upsert then outcomes = read_chunked('HMGET', outcome, ids) end

for k = 1, #ids do
  local i = 8 * k - 1
  local id, when_kind, when_ms = ids[k], ARGV[i + 1], tonumber(ARGV[i + 2])
  local expire_kind, expire_value = ARGV[i + 3], tonumber(ARGV[i + 4])
  local due = when_ms
  if when_kind == 'delay' then due = now + when_ms end
  local expire_ms = nil
  if expire_kind == 'at' then
    expire_ms = expire_value
  elseif expire_kind == 'ttl' then
    expire_ms = due + expire_value
  elseif default_ttl_ms > 0 then
    expire_ms = due + default_ttl_ms
  end
  local state, score = false, nil
  if pending[id] then
    state, score = 'scheduled', pending[id]
  elseif records[k] then
    state, score = locate(store, prepare, dead, id)
  end

  local finished_state, finished_ms = nil, nil
  if not state then finished_state, finished_ms = remembered(outcomes[k], retention_ms, now) end

  if due > now + max_delay_ms then
    append(results, CODE.TOO_FAR, due, state or 'absent')
  elseif expire_ms and expire_ms <= due then
    append(results, CODE.EXPIRES_BEFORE_DUE, due, state or 'absent')
  elseif pending_count and not state and not finished_state and pending_count >= max_pending then
    append(results, CODE.OVER_QUOTA, due, 'absent')
  elseif finished_state then
    append(results, CODE.ALREADY_DONE, finished_ms, finished_state)
  elseif state and not upsert then
    local shown = score
    if state == 'prepared' then
      local _, record_due = record_fields(records[k])
      shown = tonumber(record_due) or score
    end
    append(results, CODE.EXISTS, shown, state)
  else
    if state == 'prepared' then redis.call('ZREM', prepare, id) end
    if state == 'dead' then
      redis.call('ZREM', dead, id)
      redis.call('HDEL', reason, id)
    end
    zadd_args[#zadd_args + 1] = due
    zadd_args[#zadd_args + 1] = id
    hset_args[#hset_args + 1] = id
    hset_args[#hset_args + 1] = new_record(ARGV[i + 5], ARGV[i + 6], expire_ms)
    pending[id] = due
    local given_basis = ARGV[i + 7]
    if given_basis ~= '' or has_bases then
      if bases[id] == nil then based_ids[#based_ids + 1] = id end
      bases[id] = given_basis ~= '' and given_basis
    end
    if pending_count and not state then pending_count = pending_count + 1 end
    if earliest == nil or due < earliest then earliest = due end
    journal(journal_key, journal_max_len, 'scheduled', id, now, due, 0)
    if state then
      append(results, CODE.UPDATED, due, 'scheduled')
    else
      append(results, CODE.CREATED, due, 'scheduled')
    end
  end
end

if #zadd_args > 0 then
  call_chunked('ZADD', store, zadd_args)
  call_chunked('HSET', msg, hset_args)
  wake_if_earliest(store, wake, earliest)
end
if #based_ids > 0 then
  local hset_bases, hdel_bases = {}, {}
  for _, id in ipairs(based_ids) do
    if bases[id] then
      hset_bases[#hset_bases + 1] = id
      hset_bases[#hset_bases + 1] = bases[id]
    else
      hdel_bases[#hdel_bases + 1] = id
    end
  end
  if #hset_bases > 0 then call_chunked('HSET', basis, hset_bases) end
  if #hdel_bases > 0 then call_chunked('HDEL', basis, hdel_bases) end
end
return results
