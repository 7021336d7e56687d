"""Request bodies of the HTTP API → engine values, with errors that name the field (pure).

Everything a client can get wrong is checked here, before Redis is touched, so a 400 always says
which field (`messages[3].delayMs`) and why; the engine's own checks remain the last line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayq.queue import settings
from delayq.queue.codec import MAX_PRIORITY, Headers, encode_group, encode_id
from delayq.queue.codes import InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest, Target
from delayq.queue.topic import MAX_DELAY_MS, Topic
from delayq.queue.trace_context import TRACEPARENT, TRACESTATE, trace_context_error
from delayq.service.delivery.pull import MAX_LEASE_BATCH
from delayq.service.envelope import ENCODINGS, UTF8, decode_payload
from delayq.service.tokens import LeaseTokens, TokenError, TokenLease, TokenRefusedError

MAX_BATCH = 1000
MAX_AT_MS = 2**52
MAX_WAIT_MS = 30_000
MAX_LEASE_MS = int(settings.by_name("ack_timeout_ms").high)  # the topic's own bound
# the lease length a pull consumer asks for, and its name before this release, still accepted
ACK_TIMEOUT_FIELD, ACK_TIMEOUT_OLD_FIELD = "ackTimeoutMs", "leaseMs"
MAX_REASON_CHARS = 1000
MAX_PAGE = 1000
# `<slot>:<offset>`: a slot below 16384 and an offset Redis can take (well inside a signed 64-bit
# integer), so a forged cursor is a 400 here, never an error from Redis
CURSOR_PATTERN = "^[0-9]{1,5}:[0-9]{1,15}$"
_CURSOR = re.compile(CURSOR_PATTERN, re.ASCII)

Body = Mapping[str, Any]


class FieldError(ValueError):
    """A request field is missing or invalid (HTTP 400)."""

    status = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ForbiddenFieldError(FieldError):
    """A field is well-formed but not this topic's to accept: a lease token it did not
    issue (HTTP 403)."""

    status = 403


class PayloadTooLargeError(FieldError):
    """A payload exceeds the topic's limit (HTTP 413)."""

    status = 413


@dataclass(frozen=True)
class LeaseRequest:
    max_count: int
    ack_timeout_ms: int
    wait_ms: int
    # leases of the previous answer to ack first (`ack`): None when the request carries none
    acks: list[TokenLease] | None = None


@dataclass(frozen=True)
class NackRequest:
    leases: list[TokenLease]
    delay_ms: int  # 0 when the body has none: the route gives each the topic's backoff then
    reason: str
    dead: bool


def require_object(body: Any, field: str = "body") -> Body:
    if not isinstance(body, Mapping):
        raise FieldError(field, f"{field} must be a JSON object")
    return body


def get_int(
    body: Body, name: str, low: int, high: int, default: int | None = None, prefix: str = ""
) -> int:
    value = body.get(name, default)
    if value is None:
        raise FieldError(prefix + name, f"{prefix + name} is required")
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise FieldError(prefix + name, _int_rule(prefix + name, low, high))
    return value


def get_renamed_int(
    body: Body, name: str, old: str, low: int, high: int, default: int | None = None
) -> int:
    """`get_int` of a field renamed in this release: the old name is still accepted (until
    the next one), an error names the field the client sent, and both at once is a 400."""
    if old not in body:
        return get_int(body, name, low, high, default)
    if name in body:
        raise FieldError(old, f"{old} is the old name of {name}: give only {name}")
    return get_int(body, old, low, high, default)


def _int_rule(field: str, low: int, high: int) -> str:
    return f"{field} must be an integer between {low} and {high}"


def get_str(body: Body, name: str, default: str | None = None, prefix: str = "") -> str:
    value = body.get(name, default)
    if value is None:
        raise FieldError(prefix + name, f"{prefix + name} is required")
    if not isinstance(value, str):
        raise FieldError(prefix + name, f"{prefix + name} must be a string")
    return check_text(value, prefix + name)


def check_text(value: str, field: str) -> str:
    """JSON can carry a lone surrogate (`"\\ud800"`), which no UTF-8 encoder (Redis, a receiver)
    accepts: refuse it here. ASCII, the common case, is known without encoding."""
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise FieldError(
                field, f"{field} is not valid Unicode: it has a lone surrogate (U+D800-U+DFFF)"
            ) from None
    return value


def get_id(body: Body, name: str, prefix: str = "", default: str | None = None) -> str:
    """An id or a slot basis, by the engine's own rule (codec.encode_id), naming the field."""
    return check_id(get_str(body, name, default, prefix), prefix + name)


def check_id(value: str, field: str) -> str:
    try:
        encode_id(value, field)
    except InvalidMessageError as error:
        raise FieldError(field, str(error)) from None
    return value


def get_list(body: Body, name: str, max_items: int, prefix: str = "") -> list[Any]:
    value = body.get(name)
    if not isinstance(value, list) or not 1 <= len(value) <= max_items:
        raise FieldError(prefix + name, f"{prefix + name} must be a list of 1 to {max_items} items")
    return value


def parse_when(body: Body, prefix: str = "") -> tuple[int | None, int | None]:
    """Exactly one of delayMs (from the Redis server's now) or atMs (epoch ms)."""
    has_delay, has_at = body.get("delayMs") is not None, body.get("atMs") is not None
    if has_delay == has_at:
        raise FieldError(prefix + "delayMs", f"give exactly one of {prefix}delayMs or {prefix}atMs")
    if has_delay:
        return get_int(body, "delayMs", 0, MAX_DELAY_MS, prefix=prefix), None
    return None, get_int(body, "atMs", 0, MAX_AT_MS, prefix=prefix)


def parse_expiry(body: Body, prefix: str = "") -> tuple[int | None, int | None]:
    """At most one of expireAtMs (epoch ms) or ttlMs (after the due time); neither: the
    topic's default expiry applies."""
    has_at, has_ttl = body.get("expireAtMs") is not None, body.get("ttlMs") is not None
    if has_at and has_ttl:
        raise FieldError(
            prefix + "ttlMs", f"give at most one of {prefix}expireAtMs or {prefix}ttlMs"
        )
    if has_at:
        return get_int(body, "expireAtMs", 0, MAX_AT_MS, prefix=prefix), None
    if has_ttl:
        return None, get_int(body, "ttlMs", 1, MAX_DELAY_MS, prefix=prefix)
    return None, None


def parse_priority(body: Body, prefix: str = "") -> int:
    """0 (the default) to MAX_PRIORITY: among messages already due, a higher one is claimed
    first; it never makes a message early."""
    if body.get("priority") is None:
        return 0
    return get_int(body, "priority", 0, MAX_PRIORITY, prefix=prefix)


def parse_group(body: Body, prefix: str = "") -> str | None:
    """The message's fair group (absent or null: none), by the engine's own rule
    (codec.encode_group), naming the field."""
    group = body.get("group")
    if group is None:
        return None
    field = prefix + "group"
    if isinstance(group, str):
        check_text(group, field)
    try:
        encode_group(group, field)
    except InvalidMessageError as error:
        raise FieldError(field, str(error)) from None
    return str(group)


def parse_headers(body: Body, prefix: str = "") -> Headers:
    if "headers" not in body:  # most messages: a quarter of a batch item's parse otherwise
        return {}
    value = body["headers"]
    field = prefix + "headers"
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FieldError(field, f"{field} must map strings to strings")
    for key, text in value.items():
        check_text(key, field)
        check_text(text, f"{field}.{key}")
    if (TRACEPARENT in value or TRACESTATE in value) and (wrong := trace_context_error(value)):
        raise FieldError(f"{field}.{wrong[0]}", f"{field}.{wrong[0]}: {wrong[1]}")
    return dict(value)


def parse_payload(body: Body, topic: Topic, prefix: str = "") -> bytes:
    encoding = get_str(body, "encoding", UTF8, prefix)
    if encoding not in ENCODINGS:
        raise FieldError(prefix + "encoding", f"{prefix}encoding must be one of {ENCODINGS}")
    text = get_str(body, "payload", "", prefix)
    try:
        payload = decode_payload(text, encoding)
    except ValueError as error:
        raise FieldError(prefix + "payload", f"{prefix}payload: {error}") from error
    if len(payload) > topic.max_payload_bytes:
        raise PayloadTooLargeError(
            prefix + "payload",
            f"{prefix}payload has {len(payload)} bytes, over the topic limit of "
            f"{topic.max_payload_bytes}",
        )
    return payload


def parse_mode(body: Body) -> Mode:
    value = get_str(body, "mode", Mode.CREATE.value)
    try:
        return Mode(value)
    except ValueError:
        raise FieldError("mode", f"mode must be one of {[m.value for m in Mode]}") from None


def parse_message(body: Any, topic: Topic, prefix: str = "") -> ScheduleRequest:
    body = require_object(body, prefix.rstrip(".") or "body")
    delay_ms, at_ms = parse_when(body, prefix)
    expire_at_ms, ttl_ms = parse_expiry(body, prefix)
    slot_basis = body.get("slotBasis")
    if slot_basis is not None:
        get_id(body, "slotBasis", prefix)
    return ScheduleRequest(
        id=get_id(body, "id", prefix),
        payload=parse_payload(body, topic, prefix),
        delay_ms=delay_ms,
        at_ms=at_ms,
        slot_basis=slot_basis,
        headers=parse_headers(body, prefix),
        expire_at_ms=expire_at_ms,
        ttl_ms=ttl_ms,
        priority=parse_priority(body, prefix),
        group=parse_group(body, prefix),
    )


def with_request_trace(
    messages: list[ScheduleRequest], request_headers: Mapping[str, str]
) -> list[ScheduleRequest]:
    """The messages with the request's W3C `traceparent` (and `tracestate`) HTTP headers as
    their trace context, each message that names its own (`headers.traceparent`) keeping it:
    the HTTP headers are the producer's context when it sent the request, which instrumented
    HTTP clients add by themselves."""
    traceparent = request_headers.get(TRACEPARENT)
    if traceparent is None:
        if TRACESTATE in request_headers:
            raise FieldError(TRACESTATE, "the tracestate HTTP header needs a traceparent")
        return messages
    context = {TRACEPARENT: traceparent}
    if (tracestate := request_headers.get(TRACESTATE)) is not None:
        context[TRACESTATE] = tracestate
    if wrong := trace_context_error(context):
        raise FieldError(wrong[0], f"the {wrong[0]} HTTP header: {wrong[1]}")
    return [
        m
        if m.headers and TRACEPARENT in m.headers
        else m._replace(headers={**(m.headers or {}), **context})
        for m in messages
    ]


def parse_batch(body: Body, topic: Topic) -> list[ScheduleRequest]:
    items = get_list(body, "messages", MAX_BATCH)
    messages = [parse_message(item, topic, f"messages[{i}].") for i, item in enumerate(items)]
    _refuse_repeated_ids(messages)
    return messages


def _refuse_repeated_ids(messages: list[ScheduleRequest]) -> None:
    """One message per id in a batch. A message is (slot basis, id): the same id under two
    bases would be two messages in two slots that GET, cancel and the receivers' dedupe by id
    cannot tell apart — surely a mistake when one batch says both. The same id twice under one
    basis is one message given twice: create mode would store the first and answer the second
    `exists` as if it had been there before, upsert would keep whichever came last — either
    way a part of the batch silently not stored as sent."""
    bases: dict[str, tuple[int, str | None]] = {}
    for index, message in enumerate(messages):
        first, basis = bases.setdefault(message.id, (index, message.slot_basis))
        if first == index:
            continue
        if basis != message.slot_basis:
            field = f"messages[{index}].slotBasis"
            raise FieldError(
                field,
                f"{field} {message.slot_basis!r} differs from messages[{first}].slotBasis "
                f"{basis!r} for the same id {message.id!r}: one id, one slot basis",
            )
        field = f"messages[{index}].id"
        raise FieldError(
            field,
            f"{field} {message.id!r} repeats messages[{first}].id: one message per id in a batch",
        )


def parse_lease_request(
    body: Body, topic: Topic, tokens: LeaseTokens, max_batch: int = MAX_LEASE_BATCH
) -> LeaseRequest:
    """`ack` (optional, 0 to MAX_LEASE_BATCH tokens) is checked whole like `tokens`: one
    malformed or forged token refuses the request before anything is acked or leased."""
    acks = body.get("ack")
    if acks is not None and not (isinstance(acks, list) and len(acks) <= MAX_LEASE_BATCH):
        raise FieldError("ack", f"ack must be a list of at most {MAX_LEASE_BATCH} lease tokens")
    return LeaseRequest(
        max_count=get_int(body, "max", 1, min(max_batch, MAX_LEASE_BATCH), default=1),
        ack_timeout_ms=_ack_timeout_ms(body, topic.ack_timeout_ms),
        wait_ms=get_int(body, "waitMs", 0, MAX_WAIT_MS, default=0),
        acks=None if acks is None else _leases(acks, "ack", topic, tokens),
    )


def parse_tokens(body: Body, topic: Topic, tokens: LeaseTokens) -> list[TokenLease]:
    return _leases(get_list(body, "tokens", MAX_LEASE_BATCH), "tokens", topic, tokens)


def _leases(
    values: list[Any], name: str, topic: Topic, tokens: LeaseTokens
) -> list[TokenLease]:
    return [
        _lease(value, f"{name}[{index}]", topic, tokens) for index, value in enumerate(values)
    ]


def _lease(token: Any, field: str, topic: Topic, tokens: LeaseTokens) -> TokenLease:
    """A token decoded, its MAC checked (403: not this topic's), and its slot checked against
    the slot amount of its key generation (the topic's; twice it for a doubling's halves at the
    next generation), whatever the MAC says (one more check, cheap): the slot's keys do not
    exist outside 0..slotAmount-1."""
    if not isinstance(token, str):
        raise FieldError(field, f"{field} must be a string")
    try:
        named = tokens.decode(token, topic.slot_generation)
    except TokenRefusedError as error:
        raise ForbiddenFieldError(field, f"{field}: {error}") from error
    except TokenError as error:
        raise FieldError(field, f"{field}: {error}") from error
    lease, doublings = named.lease, named.generation - topic.slot_generation
    # each generation doubled the slot amount (at most 14 times: 16384 slots)
    amount = (
        topic.slot_amount << min(doublings, 14)
        if doublings >= 0
        else topic.slot_amount >> -doublings
    )
    if not 0 <= lease.slot < amount:
        raise FieldError(
            field,
            f"{field} names slot {lease.slot}, outside 0..{amount - 1}"
            + (f" of key generation {named.generation}" if doublings else "")
            + ": forged",
        )
    check_id(lease.id, field)
    return named


def parse_nack(body: Body, topic: Topic, tokens: LeaseTokens) -> NackRequest:
    """The leases a nack names and how to retry them; without `delayMs` each waits 0 here,
    and the route gives it the topic's backoff."""
    delay_ms = get_int(body, "delayMs", 0, MAX_DELAY_MS, default=0)
    reason = get_str(body, "reason", "")[:MAX_REASON_CHARS]
    dead = body.get("dead", False)
    if not isinstance(dead, bool):
        raise FieldError("dead", "dead must be a boolean")
    return NackRequest(parse_tokens(body, topic, tokens), delay_ms, reason, dead)


def parse_extend(body: Body, topic: Topic, tokens: LeaseTokens) -> tuple[list[TokenLease], int]:
    return parse_tokens(body, topic, tokens), _ack_timeout_ms(body)


def _ack_timeout_ms(body: Body, default: int | None = None) -> int:
    return get_renamed_int(body, ACK_TIMEOUT_FIELD, ACK_TIMEOUT_OLD_FIELD, 1, MAX_LEASE_MS, default)


def parse_target(message_id: str, slot_basis: str | None, slot: str | None, topic: Topic) -> Target:
    """The message a path names: `{id}` and, for one scheduled with a slot basis, the
    `slotBasis` query parameter or, instead, the `slot` that holds it (what a dead page
    lists); with neither, the id routes itself."""
    check_id(check_text(message_id, "id"), "id")
    basis = None if slot_basis is None else check_text(slot_basis, "slotBasis")
    in_slot = _query_int(slot, "slot", 0, topic.slot_amount - 1)
    return _routed(message_id, basis, in_slot)


def _routed(message_id: str, basis: str | None, slot: int | None, prefix: str = "") -> Target:
    """A target by at most one of `basis` and a `slot` already checked in range (they could
    disagree), checked here so that the engine's own check (`Target.slot`) never fails later."""
    if slot is not None and basis is not None:
        raise FieldError(prefix + "slot", f"give {prefix}slot or {prefix}slotBasis, not both")
    if basis is not None:
        check_id(basis, prefix + "slotBasis")
    return Target(message_id, basis, slot)


def parse_dead_targets(body: Body, topic: Topic) -> list[Target] | None:
    """None for `{"all": true}` (every dead message), else the listed `ids`: each an id, or
    an object {id} with its `slotBasis` or the `slot` a dead page reports. The slot is what a
    dead page can offer for a message scheduled with a slot basis: its record does not keep
    the basis, so without the slot only whoever remembers the basis could redrive it. A wrong
    slot is harmless: the message is not found there. Both `ids` and `all` are a 400: which
    one was meant is not ours to guess."""
    if "all" in body and "ids" in body:
        raise FieldError("all", "give ids or all, not both")
    if body.get("all") is True:
        return None
    if "all" in body and body["all"] is not False:
        raise FieldError("all", "all must be a boolean")
    return [
        _dead_target(
            require_object({"id": item} if isinstance(item, str) else item, f"ids[{index}]"),
            f"ids[{index}].",
            topic,
        )
        for index, item in enumerate(get_list(body, "ids", MAX_BATCH))
    ]


def _dead_target(fields: Body, prefix: str, topic: Topic) -> Target:
    slot, basis = fields.get("slot"), fields.get("slotBasis")
    return _routed(
        get_id(fields, "id", prefix),
        None if basis is None else get_str(fields, "slotBasis", prefix=prefix),
        None if slot is None else get_int(fields, "slot", 0, topic.slot_amount - 1, prefix=prefix),
        prefix,
    )


def parse_cursor(raw: str | None, topic: Topic) -> tuple[int, int]:
    """A dead-page cursor `<slot>:<offset>` (start: `0:0`); one past the topic's last slot is
    the end (an empty last page), as the last page's null nextCursor is."""
    if raw is None:
        return 0, 0
    if not _CURSOR.match(raw):
        raise FieldError("cursor", f"cursor must be <slot>:<offset> as returned ({CURSOR_PATTERN})")
    slot_text, offset_text = raw.split(":")
    return min(int(slot_text), topic.slot_amount), int(offset_text)


def parse_count(raw: str | None, default: int) -> int:
    count = _query_int(raw, "count", 1, MAX_PAGE)
    return default if count is None else count


def _query_int(raw: str | None, field: str, low: int, high: int) -> int | None:
    """A query parameter's integer in low..high (None when absent)."""
    if raw is None:
        return None
    # digits only, and few: int() would take " 5", "+5", non-ASCII digits and fail on 5,000 digits
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not low <= int(raw) <= high:
        raise FieldError(field, _int_rule(field, low, high))
    return int(raw)
