"""The packed message record stored in a slot's `msg` hash, and message validation (pure).

Layout: b"<attempts>:<due_ms or empty>:<lease or empty>:[x<expire ms>:][f<first attempt ms>:]"
b"[p<priority>:][g<group length>:<group>]<headers_len>:" + headers_json + payload (the
bracketed fields are optional and tagged; the priority, when above 0, and the group, when
given, are the last of them: lua/includes/record_group.lua).
One hash field per message with the metadata packed in front of the payload keeps Redis memory
per pending message low (no per-message key, no second hash entry); see
lua/includes/record_fields.lua.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from delayq.queue.codes import InvalidMessageError
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES
from delayq.queue.trace_context import TRACEPARENT, TRACESTATE, trace_context_error

Headers = dict[str, str]

# C0, DEL and C1: an id travels as an HTTP header (webhook `X-Delayq-Id`), a log field and a
# stream entry; a control character breaks the first and corrupts the others.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")
ID_RULE = (
    f"1 to {MAX_ID_BYTES} bytes of UTF-8 without control characters (C0, DEL or C1: "
    "U+0000-U+001F, U+007F-U+009F)"
)


class Record(NamedTuple):
    attempts: int
    due_ms: int | None  # set while leased: the due time the delivery was for
    lease_id: int | None  # set while leased: the lease number its token must name
    headers: Headers
    payload: bytes
    expire_ms: int | None = None  # not delivered after this instant
    first_attempt_ms: int | None = None  # when its first delivery was claimed
    priority: int = 0  # among messages already due, a higher one is claimed first
    group: str | None = None  # its fair group: due groups are claimed round-robin


def as_text(value: bytes | str) -> str:
    """Redis replies are bytes; ids and states are UTF-8 text."""
    return value.decode() if isinstance(value, bytes) else value


_EXTRA_TAGS = (ord("x"), ord("f"), ord("p"))
_GROUP_TAG = ord("g")

#: The priorities a message may carry: 0 (the default, every message without one) to 9.
MAX_PRIORITY = 9
PRIORITY_RULE = f"an integer from 0 to {MAX_PRIORITY} (higher is claimed first once due)"

#: A message's fair group (a customer id, say): due groups are claimed round-robin.
MAX_GROUP_BYTES = 128
GROUP_RULE = (
    f"1 to {MAX_GROUP_BYTES} bytes of UTF-8 without control characters (C0, DEL or C1: "
    "U+0000-U+001F, U+007F-U+009F)"
)


def split_record(raw: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """A record's attempts, due and lease fields and the rest after them. A record in
    release 0.1.0's layout (no lease field: `<attempts>:<due or empty>:<headers_len>:`...),
    which a broker upgraded from it still holds, reads with an empty lease: the rules of
    lua/includes/record_fields.lua, which rewrites it in the current layout when it changes."""
    attempts, due, lease, rest = raw.split(b":", 3)
    if lease and (not due or lease == b"0" or rest[:1] == b"{"):
        return attempts, due, b"", lease + b":" + rest
    return attempts, due, lease, rest


#: What a fresh record begins with (no attempt, due, lease, tagged field or headers) and what
#: stands for it in a bucket of records (`expanded_record`).
_FRESH_HEAD, _BUCKETED_FRESH = b"0:::0:", b"."


def expanded_record(value: bytes) -> bytes:
    """The record a bucket of records holds as `value` (docs/contracts.md §1, "Records in
    buckets"). Most records are messages scheduled and not yet claimed, whose value begins with
    `0:::0:`; a bucket keeps such a record as `.` and the rest, 5 bytes less of a listpack
    entry of about 60 (lua/includes/compacted_record.lua writes it). No record begins with `.`
    (its attempts are a number), so any other value, and every value of the flat `msg` hash,
    is the record itself."""
    if value[:1] == _BUCKETED_FRESH:
        return _FRESH_HEAD + value[1:]
    return value


def decode_record(raw: bytes) -> Record:
    attempts, due, lease, rest = split_record(raw)
    extras: dict[int, int] = {}
    while rest and rest[0] in _EXTRA_TAGS:  # the optional tagged fields, p the last
        field, rest = rest.split(b":", 1)
        extras[field[0]] = _instant(field[1:])
    group = None
    if rest and rest[0] == _GROUP_TAG:  # the group, length-prefixed: any text, ':' included
        length, rest = rest[1:].split(b":", 1)
        group, rest = rest[: int(length)].decode(), rest[int(length) :]
    headers_len, rest = rest.split(b":", 1)
    size = int(headers_len)
    headers: Headers = json.loads(rest[:size]) if size else {}
    due_ms, lease_id = (int(due) if due else None), (int(lease) if lease else None)
    return Record(
        int(attempts),
        due_ms,
        lease_id,
        headers,
        rest[size:],
        extras.get(ord("x")),
        extras.get(ord("f")),
        extras.get(ord("p"), 0),
        group,
    )


def _instant(text: bytes) -> int:
    """A tagged instant. Records stored before the scripts formatted instants as integers may
    hold Lua's exponent form (`x4.5035996273705e+15` for an expiry of 2**52): read it as the
    number it is, so such a message is still claimed instead of stalling its slot."""
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def encode_headers(headers: Headers | None) -> bytes:
    if not headers:
        return b""
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidMessageError(f"header {key!r}: names and values must be strings")
    if (TRACEPARENT in headers or TRACESTATE in headers) and (
        wrong := trace_context_error(headers)
    ):
        raise InvalidMessageError(f"header {wrong[0]}: {wrong[1]}")
    return json.dumps(headers, separators=(",", ":"), sort_keys=True).encode()


def validate_id(message_id: str, field: str = "id") -> str:
    encode_id(message_id, field)
    return message_id


def encode_id(message_id: str, field: str = "id") -> bytes:
    """The UTF-8 bytes of an id (or a slot basis, same rule), validated; schedule sends and
    hashes these (encoded once). Every id accepted here can be delivered by every topic type."""
    return _encode_text(message_id, field, MAX_ID_BYTES, ID_RULE)


def encode_group(group: object, field: str = "group") -> bytes:
    """The UTF-8 bytes of a message's group, validated as an id is (no control character: the
    scripts separate a group from an id with NUL in the slot's group indexes,
    lua/includes/group_keys.lua), of at most MAX_GROUP_BYTES."""
    return _encode_text(group, field, MAX_GROUP_BYTES, GROUP_RULE)


def _encode_text(value: object, field: str, max_bytes: int, rule: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{field} must be a non-empty string: {rule}")
    try:
        data = value.encode()
    except UnicodeEncodeError:
        raise InvalidMessageError(
            f"{field} {value[:40]!r} is not valid Unicode (a lone surrogate): {rule}"
        ) from None
    if len(data) > max_bytes:
        raise InvalidMessageError(
            f"{field} {value[:40]!r}... is longer than {max_bytes} bytes: {rule}"
        )
    # isprintable() is a fast pass for every ordinary id; only the rest are searched
    if not value.isprintable() and (found := CONTROL_CHARACTERS.search(value)):
        raise InvalidMessageError(
            f"{field} {value[:40]!r} contains the control character "
            f"U+{ord(found.group()):04X}: {rule}"
        )
    return data


def validate_payload(payload: bytes | str, max_payload_bytes: int) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    if not isinstance(data, bytes | bytearray):
        raise InvalidMessageError(f"payload must be bytes or str, not {type(payload).__name__}")
    if len(data) > max_payload_bytes:
        raise InvalidMessageError(
            f"payload of {len(data)} bytes exceeds the topic limit of {max_payload_bytes} bytes"
        )
    return bytes(data)


def when_argument(delay_ms: int | None, at_ms: int | None) -> tuple[str, int]:
    """The (when_kind, when_ms) pair the scripts take: exactly one of a delay or an instant.

    A delay is added to the Redis server's clock inside the script, so client clocks never
    decide when anything fires.
    """
    if (delay_ms is None) == (at_ms is None):
        raise InvalidMessageError("give exactly one of delay_ms or at_ms")
    if delay_ms is not None:
        _check_ms("delay_ms", delay_ms, MAX_DELAY_MS)
        return "delay", delay_ms
    assert at_ms is not None
    _check_ms("at_ms", at_ms, 2**52)
    return "at", at_ms


def expiry_argument(expire_at_ms: int | None, ttl_ms: int | None) -> tuple[str, int]:
    """The (expire_kind, expire_ms) pair schedule takes: an instant ('at'), a time after the
    due time ('ttl'), or neither ('', 0: the topic's default expiry applies)."""
    if expire_at_ms is not None and ttl_ms is not None:
        raise InvalidMessageError("give at most one of expire_at_ms or ttl_ms")
    if expire_at_ms is not None:
        _check_ms("expire_at_ms", expire_at_ms, 2**52)
        return "at", expire_at_ms
    if ttl_ms is not None:
        _check_ms("ttl_ms", ttl_ms, MAX_DELAY_MS)
        if ttl_ms < 1:
            raise InvalidMessageError(
                "ttl_ms 0 must be at least 1: a message needs time to be delivered"
            )
        return "ttl", ttl_ms
    return "", 0


def validate_priority(priority: object, field: str = "priority") -> int:
    """A message's priority, refused unless an integer (not a bool) in 0..MAX_PRIORITY."""
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidMessageError(f"{field} {priority!r} must be {PRIORITY_RULE}")
    return priority


def _check_ms(name: str, value: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise InvalidMessageError(f"{name} {value!r} must be an integer between 0 and {high}")
