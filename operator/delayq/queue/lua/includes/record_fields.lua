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
--
-- Release 0.1.0 wrote "<attempts>:<due or empty>:<headers_len>:" .. headers .. payload, with no
-- lease field; a broker upgraded from it still holds such records. One reads as a record with
-- an empty lease, `p3` being the ':' that ends its due field, so every script rewrites it in
-- the current layout (record_with). Its third field is its headers length, which is never
-- empty, and it is told apart by what the current layout never has: a lease while not leased
-- (due empty), a lease 0 (leases are drawn from 1), or '{' (its headers) after the third ':'
-- (here a tagged field or a headers length follows). codec.split_record reads alike.
--
-- attempts (number), due (string, maybe empty), lease (string, maybe empty), and the offset
-- of the ':' that ends the lease field
local function record_fields(record)
  local p1 = string.find(record, ':', 1, true)
  local p2 = string.find(record, ':', p1 + 1, true)
  local p3 = string.find(record, ':', p2 + 1, true)
  local due, lease = string.sub(record, p1 + 1, p2 - 1), string.sub(record, p2 + 1, p3 - 1)
  if lease ~= '' and (due == '' or lease == '0' or string.byte(record, p3 + 1) == 123) then
    return tonumber(string.sub(record, 1, p1 - 1)), due, '', p2  -- 0.1.0's layout
  end
  return tonumber(string.sub(record, 1, p1 - 1)), due, lease, p3
end
