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
  (and the slot's priority index, named from its store key: includes/priority_key.lua)
  (and the slot's fair groups' parts, named from its keys: includes/group_keys.lua)
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
  ARGV[7] fields                the values per message, n: 8, 9 when the call carries
                                priorities, 10 when it carries groups (a batch without any
                                sends none); any other is refused (an error) before
                                anything is written
  ARGV[8 + nk .. 7 + n + nk]    per message: id, when_kind ('delay' | 'at'), when_ms,
                                expire_kind ('' | 'at' | 'ttl': after the due time),
                                expire_ms, headers, payload, slot basis ('' = its id: no
                                entry in `basis`), and with 9 its priority (0..9; else 0); a
                                message stored (created or replaced) gets the entry of the
                                basis it is stored with, or none, and above priority 0 an
                                entry in the slot's priority index (includes/priority_key.lua):
                                among messages already due, a higher priority is claimed
                                first; with 10 its group ('' = none), kept in its record
                                (includes/record_group.lua): a grouped message waits in its
                                group's part of the slot's fair-group index
                                (includes/index_group.lua)

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
--@include now_ms
--@include refuse_if_moving
--@include schedule_slot
--@include slot_prefix

local prefix = slot_prefix(KEYS[1])  -- the slot of KEYS[1 .. 10], as schedulemany-1 names it
refuse_if_moving(KEYS[9])
local results = {}
schedule_slot(prefix, ARGV, 8, #ARGV, now_ms(), false, results)
return results
