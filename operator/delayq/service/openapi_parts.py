"""The building blocks of the OpenAPI document (pure): the parameters, the property groups
that several schemas share, and small constructors of schema and operation objects.

`openapi_schemas` and `openapi_paths` are written in these terms, so that a parameter or a
bound (taken from the constant the parser enforces) is stated once; `openapi` assembles the
document.
"""

from __future__ import annotations

from typing import Any

from delayq.queue.codec import MAX_GROUP_BYTES
from delayq.queue.recurrence import MAX_CATCH_UP, MAX_INSTANT_MS, CatchUp
from delayq.queue.schedules import DEFAULT_CATCH_UP_MAX, MAX_SCHEDULE_ID_BYTES
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, MAX_SLOT_AMOUNT
from delayq.service.delivery.pull import MAX_LEASE_BATCH
from delayq.service.envelope import BASE64_PATTERN
from delayq.service.parsing import ACK_TIMEOUT_FIELD, ACK_TIMEOUT_OLD_FIELD, MAX_AT_MS, MAX_LEASE_MS
from delayq.service.schedule_parsing import MAX_CRON_CHARS

Schema = dict[str, Any]

# no C0, DEL or C1 control character (codec.CONTROL_CHARACTERS); 1..256 bytes of UTF-8, which
# maxLength (in characters) bounds from above for ASCII
ID_SCHEMA: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ID_BYTES,
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
    "description": f"1 to {MAX_ID_BYTES} bytes of UTF-8 without control characters "
    "(U+0000-U+001F, U+007F-U+009F)",
}
GROUP_SCHEMA: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_GROUP_BYTES,
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
    "description": "the message's fair group (a customer id, say): among due messages the "
    "groups are claimed in turn, each within the topic's delivery.maxInFlightPerGroup, so one "
    f"group's herd cannot starve another's. 1 to {MAX_GROUP_BYTES} bytes of UTF-8 without "
    "control characters (U+0000-U+001F, U+007F-U+009F); absent: no group",
}
#: Marks the topic path parameter: a process serves one topic (any other is a 404), which the
#: served document states (`openapi_document(topic=...)`).
TOPIC_NAME = "x-topic-name"
TOPIC = {
    "name": "topic",
    "in": "path",
    "required": True,
    "description": "the topic this service serves (any other is a 404)",
    "schema": {"type": "string", TOPIC_NAME: True},
}
ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "the message id, percent-encoded (a '/' as %2F)",
    "schema": ID_SCHEMA,
}
SLOT_BASIS = {
    "name": "slotBasis",
    "in": "query",
    "required": False,
    "description": "the slot basis the message was scheduled with: a message is addressed by "
    "(slotBasis, id), so one scheduled with a slotBasis is found only with it",
    "schema": ID_SCHEMA,
}
#: Marks the schema of a slot number: its maximum is the topic's last slot, which the served
#: document states (`openapi_document(slot_amount)`); docs/openapi.yaml, for any topic, the
#: largest slot amount's.
SLOT_INDEX = "x-slot-index"


def slot_index(description: str) -> Schema:
    """A slot of the topic: 0..slotAmount-1."""
    return {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_SLOT_AMOUNT - 1,
        "description": f"{description} (0..slotAmount-1)",
        SLOT_INDEX: True,
    }


SLOT = {
    "name": "slot",
    "in": "query",
    "required": False,
    "description": "instead of slotBasis, the slot that holds the message (0..slotAmount-1), "
    "as a dead page lists it: a dead record does not keep its slot basis; a wrong slot is a "
    "404, a slot outside the topic or beside slotBasis a 400",
    "schema": slot_index("the slot that holds the message"),
}
RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before resending",
        "schema": {"type": "integer"},
    }
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(required: list[str], **properties: Schema) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def integer(description: str, minimum: int = 0, maximum: int | None = None) -> Schema:
    schema: Schema = {"type": "integer", "minimum": minimum, "description": description}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def renamed(schema: Schema, new: str) -> Schema:
    """A property under its name before this release, still accepted until the next one."""
    description = f"old name of {new}, until the next release"
    return {**schema, "description": description, "deprecated": True}


#: The lease length under its new and its old name: not both (parse: a 400 naming the old one).
NOT_BOTH_ACK_TIMEOUTS = {"not": {"required": [ACK_TIMEOUT_FIELD, ACK_TIMEOUT_OLD_FIELD]}}


def ack_timeout(description: str) -> dict[str, Schema]:
    """The lease length a pull request asks for, under its name and its old one."""
    schema = integer(description, 1, MAX_LEASE_MS)
    return {
        ACK_TIMEOUT_FIELD: schema,
        ACK_TIMEOUT_OLD_FIELD: renamed(schema, ACK_TIMEOUT_FIELD),
    }


def string(description: str = "") -> Schema:
    return {"type": "string", "description": description} if description else {"type": "string"}


def array(items: Schema, max_items: int, min_items: int = 0) -> Schema:
    schema: Schema = {"type": "array", "items": items, "maxItems": max_items}
    if min_items:
        schema["minItems"] = min_items
    return schema


def json_content(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def ok(description: str, schema: Schema, status: str = "200") -> Schema:
    return {status: {"description": description, **json_content(schema)}}


ERRORS: Schema = {
    str(status): {"$ref": f"#/components/responses/{name}"}
    for status, name in (
        (400, "BadRequest"),
        (401, "Unauthorized"),
        (403, "Forbidden"),
        (404, "NotFound"),
        (408, "RequestTimeout"),
        (409, "Conflict"),
        (413, "TooLarge"),
        (429, "BrokerFull"),
        (503, "Unavailable"),
    )
}


def operation(
    summary: str,
    responses: Schema,
    body: Schema | None = None,
    parameters: list[Schema] | None = None,
) -> Schema:
    op: Schema = {
        "summary": summary,
        "parameters": [TOPIC, *(parameters or [])],
        # an operation's own answer to a status wins (a pull batch's 409 lists its results)
        "responses": {**ERRORS, **responses},
    }
    if body is not None:
        op["requestBody"] = {"required": True, **json_content(body)}
    return op


WHEN = {
    "delayMs": integer(
        "delay from the Redis server's now; exactly one of delayMs and atMs", 0, MAX_DELAY_MS
    ),
    "atMs": integer(
        "instant, Unix epoch milliseconds; exactly one of delayMs and atMs; at most "
        f"{MAX_DELAY_MS} ms after the Redis server's now (else 400)",
        0,
        MAX_AT_MS,
    ),
}
EXACTLY_ONE_WHEN = [{"required": ["delayMs"]}, {"required": ["atMs"]}]


def when(required: list[str], **properties: Schema) -> Schema:
    """An object with exactly one of delayMs and atMs (parse_when)."""
    return {**obj(required, **WHEN, **properties), "oneOf": EXACTLY_ONE_WHEN}


def at_most_one_expiry(required: list[str], **properties: Schema) -> Schema:
    """`when`, and not both expireAtMs and ttlMs (parse_expiry)."""
    return {
        **when(required, **properties),
        "not": {"required": ["expireAtMs", "ttlMs"]},
        **BASE64_WHEN_SAID,
    }


PAYLOAD = {
    "payload": string(
        "UTF-8 text, or base64 when encoding is base64 (the standard alphabet, padded)"
    ),
    "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
}
#: A payload whose encoding is base64 is base64 (decode_payload): JSON Schema's `if` is not
#: OpenAPI 3.0's, so said as "utf-8 (or none), else a base64 payload (or none)".
BASE64_WHEN_SAID = {
    "anyOf": [
        {"properties": {"encoding": {"enum": ["utf-8"]}}},
        {"properties": {"payload": {"type": "string", "pattern": BASE64_PATTERN}}},
    ]
}
LEASE_TOKEN = (
    "lease token from a lease answer: opaque, bound to this topic and authenticated (an "
    "HMAC-SHA256 under the topic's lease-token key); another topic's or an altered one is a 403"
)
TOKENS = {"tokens": array(string(LEASE_TOKEN), MAX_LEASE_BATCH, 1)}
MODE = {"type": "string", "enum": ["create", "upsert"], "default": "create"}

SCHEDULE_ID = {
    **ID,
    "description": "the schedule id, percent-encoded; at most "
    f"{MAX_SCHEDULE_ID_BYTES} bytes (its occurrences' ids append @<due ms>)",
}
RECURRENCE: dict[str, Schema] = {
    "cron": {
        "type": "string",
        "maxLength": MAX_CRON_CHARS,
        "description": "cron expression, 5 fields (minute first) or 6 (seconds first), in "
        "timeZone; DST as Debian cron: a local time the spring-forward gap skips fires right "
        "after the gap, one the fall-back repeats fires once. Exactly one of cron and everyMs",
    },
    "timeZone": {
        "type": "string",
        "default": "UTC",
        "description": "IANA time zone of cron (e.g. Europe/Berlin)",
    },
    "everyMs": integer(
        "period in ms; occurrences at startMs + k * everyMs (startMs defaults to one period "
        "after the schedule is put). Exactly one of cron and everyMs",
        1,
        MAX_INSTANT_MS,
    ),
    "startMs": integer("no occurrence before this instant (epoch ms)", 0, MAX_INSTANT_MS),
    "endMs": integer("no occurrence after this instant (epoch ms)", 0, MAX_INSTANT_MS),
    "catchUp": {
        "type": "string",
        "enum": [c.value for c in CatchUp],
        "default": CatchUp.ONCE.value,
        "description": "occurrences missed while nobody claimed the slot: once = deliver the "
        "first missed one and resume after now; all = deliver them, at most catchUpMax of the "
        "latest; skip = deliver none",
    },
    "catchUpMax": {
        **integer("bound of catchUp all", 1, MAX_CATCH_UP),
        "default": DEFAULT_CATCH_UP_MAX,
    },
}
