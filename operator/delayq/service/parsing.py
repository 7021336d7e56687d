"""Request bodies of the HTTP API → engine values, with errors that name the field (pure).

Everything a client can get wrong is checked here, before Redis is touched, so a 400 always says
which field (`messages[3].delayMs`) and why; the engine's own checks remain the last line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayq.queue.codec import Headers
from delayq.queue.model import Lease, Mode, ScheduleRequest
from delayq.queue.plans import Retry, Target
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, Topic
from delayq.service.delivery.pull import MAX_LEASE_BATCH
from delayq.service.envelope import ENCODINGS, UTF8, decode_payload
from delayq.service.tokens import TokenError, decode_token

MAX_BATCH = 1000
MAX_AT_MS = 2**52
MAX_WAIT_MS = 30_000
MAX_LEASE_MS = 24 * 3600 * 1000
MAX_REASON_CHARS = 1000

Body = Mapping[str, Any]


class FieldError(ValueError):
    """A request field is missing or invalid (HTTP 400)."""

    status = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLargeError(FieldError):
    """A payload exceeds the topic's limit (HTTP 413)."""

    status = 413


@dataclass(frozen=True)
class LeaseRequest:
    max_count: int
    lease_ms: int
    wait_ms: int


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
        raise FieldError(
            prefix + name, f"{prefix + name} must be an integer between {low} and {high}"
        )
    return value


def get_str(
    body: Body, name: str, default: str | None = None, prefix: str = "", max_bytes: int = 0
) -> str:
    value = body.get(name, default)
    if value is None:
        raise FieldError(prefix + name, f"{prefix + name} is required")
    if not isinstance(value, str):
        raise FieldError(prefix + name, f"{prefix + name} must be a string")
    if max_bytes and (not value or len(value.encode()) > max_bytes):
        raise FieldError(prefix + name, f"{prefix + name} must have 1 to {max_bytes} bytes")
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


def parse_headers(body: Body, prefix: str = "") -> Headers:
    value = body.get("headers", {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FieldError(prefix + "headers", f"{prefix}headers must map strings to strings")
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
    slot_basis = body.get("slotBasis")
    if slot_basis is not None:
        get_str(body, "slotBasis", prefix=prefix, max_bytes=MAX_ID_BYTES)
    return ScheduleRequest(
        id=get_str(body, "id", prefix=prefix, max_bytes=MAX_ID_BYTES),
        payload=parse_payload(body, topic, prefix),
        delay_ms=delay_ms,
        at_ms=at_ms,
        slot_basis=slot_basis,
        headers=parse_headers(body, prefix),
    )


def parse_batch(body: Body, topic: Topic) -> list[ScheduleRequest]:
    items = get_list(body, "messages", MAX_BATCH)
    return [parse_message(item, topic, f"messages[{i}].") for i, item in enumerate(items)]


def parse_lease_request(body: Body, topic: Topic, max_batch: int = MAX_LEASE_BATCH) -> LeaseRequest:
    return LeaseRequest(
        max_count=get_int(body, "max", 1, min(max_batch, MAX_LEASE_BATCH), default=1),
        lease_ms=get_int(body, "leaseMs", 1, MAX_LEASE_MS, default=topic.ack_timeout_ms),
        wait_ms=get_int(body, "waitMs", 0, MAX_WAIT_MS, default=0),
    )


def parse_tokens(body: Body) -> list[Lease]:
    tokens = get_list(body, "tokens", MAX_LEASE_BATCH)
    leases = []
    for index, token in enumerate(tokens):
        field = f"tokens[{index}]"
        if not isinstance(token, str):
            raise FieldError(field, f"{field} must be a string")
        try:
            leases.append(decode_token(token))
        except TokenError as error:
            raise FieldError(field, f"{field}: {error}") from error
    return leases


def parse_nack(body: Body) -> list[Retry]:
    backoff_ms = get_int(body, "delayMs", 0, MAX_DELAY_MS, default=0)
    reason = get_str(body, "reason", "")[:MAX_REASON_CHARS]
    dead = body.get("dead", False)
    if not isinstance(dead, bool):
        raise FieldError("dead", "dead must be a boolean")
    return [Retry(lease, backoff_ms, reason, dead) for lease in parse_tokens(body)]


def parse_extend(body: Body) -> tuple[list[Lease], int]:
    return parse_tokens(body), get_int(body, "leaseMs", 1, MAX_LEASE_MS)


def parse_targets(body: Body) -> list[Target]:
    """`ids`: message ids, or objects {id, slotBasis} for messages routed by a slot basis."""
    targets = []
    for index, item in enumerate(get_list(body, "ids", MAX_BATCH)):
        prefix = f"ids[{index}]"
        if isinstance(item, str):
            item = {"id": item}
        item = require_object(item, prefix)
        basis = item.get("slotBasis")
        if basis is not None:
            get_str(item, "slotBasis", prefix=prefix + ".", max_bytes=MAX_ID_BYTES)
        targets.append(
            Target(get_str(item, "id", prefix=prefix + ".", max_bytes=MAX_ID_BYTES), basis)
        )
    return targets


def parse_all_or_ids(body: Body) -> list[Target] | None:
    """None for `{"all": true}` (every dead message), else the listed targets."""
    if body.get("all") is True:
        return None
    if "all" in body and body["all"] is not False:
        raise FieldError("all", "all must be a boolean")
    return parse_targets(body)


def parse_cursor(raw: str | None, topic: Topic) -> tuple[int, int]:
    """A dead-page cursor `<slot>:<offset>` (start: `0:0`)."""
    if not raw:
        return 0, 0
    try:
        slot_text, offset_text = raw.split(":", 1)
        slot, offset = int(slot_text), int(offset_text)
    except ValueError:
        raise FieldError("cursor", "cursor must be <slot>:<offset> as returned") from None
    if not 0 <= slot < topic.slot_amount or offset < 0:
        raise FieldError("cursor", f"cursor slot must be in 0..{topic.slot_amount - 1}")
    return slot, offset


def parse_count(raw: str | None, default: int, high: int) -> int:
    try:
        count = default if raw is None else int(raw)
    except ValueError:
        raise FieldError("count", "count must be an integer") from None
    if not 1 <= count <= high:
        raise FieldError("count", f"count must be between 1 and {high}")
    return count
