-- Whether a failed message gets no further attempt: its attempts passed max_retries, or the
-- next one (at next_ms) would fall after the retry window, retry_for_ms after its first
-- attempt's claim (first_ms, record_extras; a window of 0 is none). The nack and the claim's
-- lease rollback decide with it, so both end retries alike.
local function retries_exhausted(attempts, max_retries, first_ms, retry_for_ms, next_ms)
  return attempts > max_retries
    or (retry_for_ms > 0 and first_ms ~= nil and next_ms > first_ms + retry_for_ms)
end
