--@include call_chunked

-- The slot basis entries of messages that just finished (`ids`, their outcomes remembered by
-- `remember`). Kept while the outcome is (forget_expired deletes both), so that a doubling of
-- the slots still places the outcome by its basis and a create-only resend of (basis, id)
-- stays refused as ALREADY_DONE; deleted at once when the topic remembers no outcome.
local function forget_bases(basis, retention_ms, ids)
  if retention_ms == 0 then call_chunked('HDEL', basis, ids) end
end
