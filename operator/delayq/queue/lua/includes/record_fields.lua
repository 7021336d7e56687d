-- Record layout (the value of a message in the slot's `msg` hash):
--   "<attempts>:<due_ms or empty>:<lease or empty>:[x<expire ms>:][f<first attempt ms>:]"
--   .. "<headers_len>:" .. headers .. payload
-- (the optional tagged fields: record_extras).
-- `due` is empty while the message waits in `store` (its due time is the store score) and holds
-- the due time it was delivered for while it is leased, so lateness can be reported. `lease` is
-- empty unless leased; then it holds the number the claim drew from the slot's `leases`
-- counter, which never repeats in a slot: a lease token names exactly one lease, so a stale
-- token can never ack, nack or extend a later lease of the same id (after an upsert, redrive,
-- or an ack and a new schedule of the same id, `attempts` starts again but `lease` does not).
--
-- attempts (number), due (string, maybe empty), lease (string, maybe empty), and the offset
-- of the ':' that ends the lease field
local function record_fields(record)
  local p1 = string.find(record, ':', 1, true)
  local p2 = string.find(record, ':', p1 + 1, true)
  local p3 = string.find(record, ':', p2 + 1, true)
  return tonumber(string.sub(record, 1, p1 - 1)), string.sub(record, p1 + 1, p2 - 1),
    string.sub(record, p2 + 1, p3 - 1), p3
end
