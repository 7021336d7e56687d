-- A record as a bucket of records holds it (record_buckets; docs/contracts.md §1, "Records in
-- buckets"). Most records in a slot are messages scheduled and not yet claimed, whose value
-- begins with the same 6 bytes, `0:::0:` (no attempt, due, lease, tagged field or headers:
-- new_record): a bucket keeps such a record as `.` and the rest, 5 bytes less of a listpack
-- entry of about 60. No record begins with `.` (its first field, the attempts, is a number),
-- so a bucket's value that does is one of those (expanded_record; queue/codec.py reads
-- alike). Only the buckets hold the short form: the flat `msg` hash keeps every record whole,
-- and every reader of a bucket answers the whole record.
local function compacted_record(record)
  if string.sub(record, 1, 6) == '0:::0:' then return '.' .. string.sub(record, 7) end
  return record
end
