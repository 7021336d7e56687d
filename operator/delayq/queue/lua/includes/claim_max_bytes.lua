-- A claim stops taking messages once the records it took reach this many bytes (it always
-- takes one): what a claim holds at once above maxmemory grows with what it claims
-- (claim_slot), and the rest of what is due is claimed by the next call.
local CLAIM_MAX_BYTES = 1048576
