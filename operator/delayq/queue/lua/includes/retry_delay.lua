-- How long a message whose lease ran out waits before it is claimable again: the caller's
-- retry backoff (queue/backoff.py `Backoff`, the same policy a nack follows), base * multiplier
-- ^ (attempts - 1) capped at max, or nothing when `backoff` is nil (redelivered at once: a
-- takeover's rollback, or a caller of the previous version). Full jitter draws a fraction per
-- message from the caller's `spread` (one random number per call) stepped by the golden ratio,
-- so the messages of one call spread over the whole range rather than sharing one delay.
local function retry_delay(backoff, attempts, n)
  if backoff == nil or backoff.base_ms <= 0 then return 0 end
  local ceiling = backoff.max_ms
  local exponent = math.max(0, attempts - 1)
  if exponent <= 64 then
    ceiling = math.min(backoff.max_ms, math.floor(backoff.base_ms * backoff.multiplier ^ exponent))
  end
  if backoff.spread == nil then return ceiling end
  local fraction = (backoff.spread + n * 0.6180339887498949) % 1
  return math.floor(fraction * (ceiling + 1))
end
