#!lua flags=allow-oom
--[[
  Draw from the topic's pace before a claim (queue/pacing.py): a token bucket refilled at
  per_second (the topic's rate limit, shared by every pod of every broker) and a hold a
  receiver asked for (hold-1): while it lasts nothing is granted. The bucket lives on the
  topic's first broker, outside every slot; its key expires once the bucket would be full again
  and no hold is left, so a topic whose limit was removed leaves nothing behind.

  The limit is the topic's settings record's (queue/topic_record.py), read at every draw: a
  change the operator publishes applies to every pod's next draw, without a restart. The
  caller's values are the fallback while the record lacks them (none published yet, an
  operator of the previous version). The record is read, never written, and named in ARGV,
  not KEYS: FCALL takes every key it is given as written to, and the topic's users may only
  read it (queue/acl.py).

  KEYS[1] pace  HASH tokens, at (server ms of tokens), until (server ms the hold ends)

  ARGV[1] per_second  tokens added per second; 0 = no rate limit (only the hold is checked)
                      (record: rate_limit_per_second)
  ARGV[2] burst       the bucket's size: tokens at most (a new bucket starts full); 0 = a tenth
                      of a second's tokens, at least 1 (record: rate_limit_burst)
  ARGV[3] want        tokens asked for
  ARGV[4] least       grant nothing below this many (a claim worth its round trip), <= want;
                      a bucket smaller than that grants its size
  ARGV[5] returned    tokens drawn earlier and not used (claims that found less): added back
  ARGV[6] record      the topic's settings record to read the limit from: the one of its
                      slot 0, which its owner writes on every broker ('' = none)

  Returns {granted, wait_ms, per_second, burst, held}: granted tokens (0..want), and when
  none, how long until the hold ends or `least` tokens are there (0 when granted); the limit
  obeyed (the rate as text: it may be fractional), the bucket's size (0 without a rate limit),
  and 1 while a hold lasts, else 0. A draw of 0 tokens only asks.

  Runs under maxmemory (allow-oom): one small hash, and delivery drains a full broker.

  Events: none
]]
--@include now_ms

local key = KEYS[1]
local per_second, burst = ARGV[1], ARGV[2]
if ARGV[6] ~= '' then
  local limit = redis.call('HMGET', ARGV[6], 'rate_limit_per_second', 'rate_limit_burst')
  per_second, burst = limit[1] or per_second, limit[2] or burst
end
per_second, burst = tonumber(per_second), tonumber(burst)
if per_second <= 0 then
  burst = 0
elseif burst <= 0 then
  burst = math.max(1, math.ceil(per_second / 10))
end
-- the longest wait or expiry in ms: far beyond any the settings allow (0.001/s refills a bucket
-- of 1e6 in 1e12 ms), far below where a double loses whole numbers or PEXPIRE overflows; a
-- rate of a record written by hand cannot turn them into 'inf' or exponent form ('1e+17')
local MAX_MS = 1e15
local want, least, returned = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local state = redis.call('HMGET', key, 'tokens', 'at', 'until')
local hold_until = tonumber(state[3]) or 0
if hold_until > now then
  return {0, hold_until - now, tostring(per_second), burst, 1}
end
if per_second <= 0 then
  return {want, 0, '0', 0, 0}
end
local tokens = tonumber(state[1])
if tokens == nil then
  tokens = burst
else
  local at = tonumber(state[2]) or now
  tokens = tokens + returned + math.max(0, now - at) * per_second / 1000
end
tokens = math.min(burst, tokens)
least = math.min(least, burst)
local granted, wait_ms = 0, 0
if tokens >= least then
  granted = math.min(want, math.floor(tokens))
  tokens = tokens - granted
else
  wait_ms = math.min(MAX_MS, math.ceil((least - tokens) * 1000 / per_second))
end
redis.call('HSET', key, 'tokens', tostring(tokens), 'at', now)
local refill_ms = math.min(MAX_MS, math.ceil((burst - tokens) * 1000 / per_second))
local expire_ms = math.max(refill_ms, hold_until - now, 0) + 1000
redis.call('PEXPIRE', key, string.format('%d', expire_ms))
return {granted, wait_ms, tostring(per_second), burst, 0}
