"""The OpenAPI 3 document of the HTTP API, built as data (pure).

Served at `/openapi.json` and checked into `docs/openapi.yaml`; regenerate the latter with
`python -m delayq.service.openapi > docs/openapi.yaml` (a test asserts the two are equal).
Every bound comes from the constant the parser enforces (`parsing`, `topic`), so the document
cannot promise what the server refuses.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from delayq.queue.codec import MAX_GROUP_BYTES, MAX_PRIORITY
from delayq.queue.model import State
from delayq.queue.recurrence import MAX_CATCH_UP, MAX_INSTANT_MS, CatchUp
from delayq.queue.schedules import DEFAULT_CATCH_UP_MAX, MAX_SCHEDULE_ID_BYTES
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, MAX_SLOT_AMOUNT, TopicType
from delayq.service.delivery.pull import MAX_LEASE_BATCH
from delayq.service.envelope import BASE64_PATTERN
from delayq.service.overview import DUE_WINDOWS, MAX_LISTED, MAX_SLOT_PAGE, STALLED_AFTER_MS
from delayq.service.parsing import (
    ACK_TIMEOUT_FIELD,
    ACK_TIMEOUT_OLD_FIELD,
    CURSOR_PATTERN,
    MAX_AT_MS,
    MAX_BATCH,
    MAX_LEASE_MS,
    MAX_PAGE,
    MAX_REASON_CHARS,
    MAX_WAIT_MS,
)
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

SCHEMAS: dict[str, Schema] = {
    "Error": obj(["error"], error=string(), field=string("the request field at fault")),
    "ScheduleRequest": at_most_one_expiry(
        ["id"],
        expireAtMs=integer(
            "not delivered after this instant (Unix epoch ms, after the due time); at most one "
            "of expireAtMs and ttlMs, neither: the topic's expiry.ttl",
            0,
            MAX_AT_MS,
        ),
        ttlMs=integer(
            "not delivered later than this after its due time; at most one of expireAtMs and ttlMs",
            1,
            MAX_DELAY_MS,
        ),
        priority={
            **integer(
                "among messages already due, a higher priority is claimed first (push delivery "
                "and pull leases); it never makes a message early. 0, the default, is every "
                "message without one",
                0,
                MAX_PRIORITY,
            ),
            "default": 0,
        },
        group=GROUP_SCHEMA,
        id={
            **ID_SCHEMA,
            "description": "message id (idempotency key within its slot basis): "
            + ID_SCHEMA["description"],
        },
        slotBasis={
            **ID_SCHEMA,
            "description": "routes the message instead of its id; the "
            "message is then addressed by (slotBasis, id)",
        },
        mode=MODE,
        **PAYLOAD,
    ),
    "ScheduleResult": obj(
        ["id", "slot", "result", "dueMs", "state"],
        id=string(),
        slot=integer("slot of the message"),
        result={
            "type": "string",
            "enum": [
                "created",
                "exists",
                "updated",
                "already_done",
                "too_far",
                "expires_before_due",
                "over_quota",
            ],
            "description": "already_done (create mode): the id finished (state done, cancelled, "
            "purged, dropped or expired) within the topic's outcomeRetention, at dueMs; not "
            "scheduled again. too_far and expires_before_due (batches only): atMs lies more "
            "than 20 years ahead, or the expiry is not after the due time; over_quota (batches "
            "only): the topic's limits.maxPending is reached in its slot, resend later; none of "
            "these stored (state absent)",
        },
        dueMs=integer("due instant, server epoch ms (already_done: when it finished)"),
        state={"type": "string", "enum": [s.value for s in State]},
    ),
    "ScheduleFailure": obj(
        ["id", "slot", "result", "error"],
        id=string(),
        slot=integer("slot of the message"),
        result={
            "type": "string",
            "enum": ["failed", "unknown"],
            "description": "failed: Redis refused its slot's chunk, not stored; unknown: the "
            "broker did not answer, it may be stored. Resend both (create mode).",
        },
        error=string(
            "what Redis answered, as `<error type>: <text>` (BrokerFullError: the broker is "
            "full, resend after Retry-After)"
        ),
    ),
    "Message": obj(
        ["id", "slot", "state", "attempts", "payload", "encoding", "headers", "priority"],
        id=string(),
        slot=integer("slot"),
        state={
            "type": "string",
            "enum": [s.value for s in State if s is not State.ABSENT],
            "description": "done, cancelled, purged, dropped, expired: finished within the "
            "topic's outcomeRetention (attempts and finishedMs only)",
        },
        attempts=integer("deliveries so far"),
        dueMs=integer("due instant"),
        leaseDeadlineMs=integer("lease deadline while prepared"),
        diedMs=integer("time of death while dead"),
        finishedMs=integer("when it was acked, cancelled, purged, dropped or expired"),
        expireAtMs=integer("not delivered after this instant"),
        priority=integer("the priority it was scheduled with (0 when none)", 0, MAX_PRIORITY),
        group={**GROUP_SCHEMA, "description": "the fair group it was scheduled with (if any)"},
        deadReason=string(),
        **PAYLOAD,
    ),
    "Delivery": obj(
        ["id", "topic", "namespace", "payload", "encoding", "headers", "attempt", "dueMs"],
        id=string(),
        topic=string(),
        namespace=string(),
        attempt=integer("1 for the first delivery", 1),
        dueMs=integer("due instant"),
        token=string(
            "pull leases only: present it to ack, nack or extend; opaque, bound to this topic"
        ),
        **PAYLOAD,
    ),
    "Outcome": obj(
        ["id", "result"],
        id=string(),
        result=string("e.g. acked, retry_scheduled, dead, extended, lease_lost, stale_epoch"),
        atMs=integer("new due time (nack) or lease deadline (extend)"),
        token=string(),
    ),
    "Outcomes": obj(["results"], results=array(ref("Outcome"), MAX_BATCH)),
    "ScheduleDefinition": {
        **obj([], **RECURRENCE, **PAYLOAD),
        "additionalProperties": False,
        "oneOf": [{"required": ["cron"]}, {"required": ["everyMs"]}],
        **BASE64_WHEN_SAID,
    },
    "Schedule": obj(
        [
            "id",
            "slot",
            "catchUp",
            "catchUpMax",
            "payload",
            "encoding",
            "headers",
            "currentId",
            "currentDueMs",
            "waiting",
            "nextDueMs",
            "ended",
        ],
        id=string(),
        slot=integer("slot of the schedule and its occurrences"),
        currentId=string(
            "message id of the latest occurrence (<id>@<due ms>, slot basis the schedule id)"
        ),
        currentDueMs=integer("due instant of the latest occurrence"),
        waiting={"type": "boolean", "description": "the latest occurrence is not claimed yet"},
        nextDueMs={
            **integer("the precomputed occurrence after it; null while being computed or ended"),
            "nullable": True,
        },
        ended={"type": "boolean", "description": "no occurrence after the latest one"},
        **RECURRENCE,
        **PAYLOAD,
    ),
    "Overview": obj(
        ["topic", "nowMs", "depth", "dueHistogram", "fleet", "process"],
        namespace=string(),
        topic=string(),
        topicType={"type": "string", "enum": [t.value for t in TopicType]},
        slotAmount=integer("slots of the topic", 1, MAX_SLOT_AMOUNT),
        brokers=integer("Redis brokers of the topic", 1),
        nowMs=integer("the Redis server's clock when read"),
        ageMs=integer("how old this reading is (answers are cached for a second)"),
        depth=obj(
            ["scheduled", "due", "prepared", "dead"],
            scheduled=integer("in store (waiting, due included)"),
            due=integer("due, not yet claimed"),
            prepared=integer("leased (in flight)"),
            dead=integer("dead"),
        ),
        nextDueMs={"type": "integer", "nullable": True},
        oldestOverdueMs=integer("how long the oldest due, unclaimed message has waited"),
        paused={"type": "boolean", "description": "delivery is paused on some broker"},
        pausedBrokers=array(integer("a broker whose delivery is paused"), MAX_SLOT_AMOUNT),
        paced={
            "type": "boolean",
            "description": "the topic's rate limit or a receiver's Retry-After held claims back "
            "within the last second (due messages wait on purpose: not stalled)",
        },
        rateLimitPerSecond={
            "type": "number",
            "minimum": 0,
            "description": "delivery.rateLimit.perSecond: messages per second at most (0: none)",
        },
        rateLimitBurst=integer("the rate limit's bucket: messages at once (0: no limit)"),
        receiverHoldMs=integer(
            "how much longer a receiver's Retry-After holds delivery, as this process knows "
            "(0: no hold)"
        ),
        webhookConcurrency={
            "type": "integer",
            "nullable": True,
            "minimum": 1,
            "description": "webhook POSTs this process allows in flight now: "
            "webhookMaxInFlight, halved on timeouts and 5xx answers, grown back by successes "
            "(AIMD); null: not a webhook topic",
        },
        webhookMaxInFlight={
            "type": "integer",
            "nullable": True,
            "minimum": 1,
            "description": "delivery.webhook.maxInFlight (null: not a webhook topic)",
        },
        latenessObjectiveMs=integer(
            "objectives.latenessP99: the p99 lateness objective in ms (0: none)"
        ),
        objectiveWindowMs=integer("objectives.window: the time the objective is measured over"),
        dueHistogram=obj(
            ["overdue", *(name for name, _ in DUE_WINDOWS), "later"],
            overdue=integer("due already, not claimed"),
            **{
                name: integer(f"due within {ms} ms after now, after the previous window")
                for name, ms in DUE_WINDOWS
            },
            later=integer("due after the last window"),
        ),
        fleet=obj(
            ["members", "heldSlots", "unownedSlots", "stalledSlots"],
            members=array(string("member id of a live process"), MAX_SLOT_AMOUNT),
            heldSlots={
                **integer("slots some process holds (null: ZooKeeper unreadable)"),
                "nullable": True,
            },
            unownedSlots={
                **integer("slots nobody holds (null: ZooKeeper unreadable)"),
                "nullable": True,
            },
            error=string("why the ownership is unknown (ZooKeeper unreachable)"),
            unowned=array({"type": "integer"}, MAX_LISTED),
            stalledSlots=integer(
                f"slots with a due message unclaimed for {STALLED_AFTER_MS} ms or more, "
                "delivery not paused"
            ),
            stalled=array({"type": "integer"}, MAX_LISTED),
            stalledAfterMs=integer("the stall threshold"),
        ),
        process=obj(
            ["member", "deliveries", "lateness"],
            member=string("the process that answered"),
            deliveries={
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "description": "deliveries by outcome since the process started",
            },
            retries=integer("retries scheduled"),
            dead=integer("sent to dead"),
            ownedSlots=integer("slots this process consumes"),
            lateness=obj(
                ["boundsMs", "counts"],
                boundsMs=array({"type": "number"}, 64),
                counts=array({"type": "integer"}, 65),
            ),
            latenessP50Ms={"type": "number", "nullable": True},
            latenessP99Ms={"type": "number", "nullable": True},
        ),
    ),
    "SlotHeat": obj(
        ["slotAmount", "members", "owner", "scheduled", "due", "oldestOverdueMs", "stalled"],
        slotAmount=integer("slots of the topic", 1, MAX_SLOT_AMOUNT),
        ageMs=integer("how old the depths are"),
        stalledAfterMs=integer("the stall threshold"),
        members=array(string("member a value of owner indexes"), MAX_SLOT_AMOUNT),
        owner={
            **array(
                integer("index into members of its holding member; -1: unowned", -1),
                MAX_SLOT_AMOUNT,
            ),
            "nullable": True,
            "description": "per slot; null when ZooKeeper could not be read (fleetError)",
        },
        fleetError={"type": "string", "nullable": True},
        scheduled=array(integer("in store, per slot"), MAX_SLOT_AMOUNT),
        due=array(integer("due, not claimed, per slot"), MAX_SLOT_AMOUNT),
        oldestOverdueMs=array(integer("how long the oldest due message waited"), MAX_SLOT_AMOUNT),
        stalled=array({"type": "boolean"}, MAX_SLOT_AMOUNT),
        paused=array({"type": "boolean"}, MAX_SLOT_AMOUNT),
    ),
    "SlotMap": obj(
        ["slotAmount", "members", "slots", "nextStart"],
        slotAmount=integer("slots of the topic", 1, MAX_SLOT_AMOUNT),
        members=array(string(), MAX_SLOT_AMOUNT),
        ageMs=integer("how old the depths are"),
        slots=array(
            obj(
                ["slot", "broker", "held", "scheduled", "due", "prepared", "dead", "stalled"],
                slot=integer("slot"),
                broker=integer("broker index storing it"),
                owner={"type": "string", "nullable": True, "description": "holding member"},
                assigned={
                    "type": "string",
                    "nullable": True,
                    "description": "member the assignment gives it",
                },
                held={"type": "boolean"},
                epoch={"type": "integer", "nullable": True, "description": "fencing epoch"},
                scheduled=integer("in store"),
                due=integer("due, not claimed"),
                prepared=integer("leased"),
                dead=integer("dead"),
                nextDueMs={"type": "integer", "nullable": True},
                oldestOverdueMs=integer("age of the oldest due message"),
                stalled={"type": "boolean"},
                paused={"type": "boolean", "description": "its broker's delivery is paused"},
            ),
            MAX_SLOT_PAGE,
        ),
        nextStart={"type": "integer", "nullable": True},
    ),
    "Ids": {
        **obj(
            [],
            ids=array(
                {
                    "oneOf": [
                        ID_SCHEMA,
                        obj(
                            ["id"],
                            id=ID_SCHEMA,
                            slotBasis=ID_SCHEMA,
                            slot=slot_index(
                                "the slot a dead page reports (instead of slotBasis: a "
                                "message scheduled with one is found by its slot)"
                            ),
                        )
                        | {"not": {"required": ["slot", "slotBasis"]}},
                    ]
                },
                MAX_BATCH,
                1,
            ),
            all={"type": "boolean", "description": "every dead message instead of ids"},
        ),
        "anyOf": [
            {"required": ["ids"]},
            {"required": ["all"], "properties": {"all": {"enum": [True]}}},
        ],
        "not": {"required": ["ids", "all"]},
    },
    # not an operation of this service: what a batched webhook's receiver answers it
    "WebhookBatchReply": {
        **obj(
            ["results"],
            results=array(
                obj(
                    ["id", "status"],
                    id=ID_SCHEMA,
                    status=integer(
                        "this message's answer: 2xx acks it, anything else retries it", 100, 599
                    ),
                    retryAfter={
                        "oneOf": [
                            integer("seconds", 0),
                            string("seconds or an HTTP date, as the Retry-After header"),
                        ],
                        "description": "with a 429 or 503: the message's own Retry-After. It "
                        "is given back, no attempt counted, and the topic held that long (every "
                        "pod; at most 5 minutes and expiry.ttl), then delivered at the same "
                        "attempt; without it a 429 or 503 is an ordinary failure",
                    },
                ),
                MAX_BATCH,
            ),
        ),
        "description": "What the receiver of a webhook topic with delivery.webhook.maxBatch > 1 "
        'answers a POST of {"messages": [...]}: one result per message, by id '
        '(docs/service.md, "Batched webhooks"). Not an operation of this service.',
    },
}


def _error_response(description: str, headers: Schema | None = None) -> Schema:
    response = {"description": description, **json_content(ref("Error"))}
    if headers:
        response["headers"] = headers
    return response


NOT_ALL_DEAD = {
    "404": {
        "description": "a listed id is not dead (unknown, forgotten or live: result "
        "wrong_state); the others' results say what was done. Or an unknown topic (Error)",
        **json_content({"oneOf": [ref("Outcomes"), ref("Error")]}),
    }
}


def _paths() -> dict[str, Schema]:
    messages = "/v1/topics/{topic}/messages"
    leases = "/v1/topics/{topic}/leases"
    dead = "/v1/topics/{topic}/dead"
    schedules = "/v1/topics/{topic}/schedules"
    outcomes = {
        **ok("one result per token", ref("Outcomes")),
        "409": {
            "description": "some lease was lost or fenced: one result per token says which",
            **json_content(ref("Outcomes")),
        },
    }
    results = obj(
        ["results"],
        results=array({"oneOf": [ref("ScheduleResult"), ref("ScheduleFailure")]}, MAX_BATCH),
    )
    return {
        messages: {
            "post": operation(
                "Schedule one message",
                {
                    **ok("created", ref("ScheduleResult"), "201"),
                    **ok("existed (create) or replaced (upsert)", ref("ScheduleResult")),
                },
                ref("ScheduleRequest"),
            )
        },
        messages + "/batch": {
            "post": operation(
                f"Schedule 1 to {MAX_BATCH} messages, each id once (an id twice is a 400)",
                {
                    **ok("every message stored: a result per message, in order", results),
                    "207": {
                        "description": "not every message stored: a result per message says "
                        "which. too_far and expires_before_due are refused for good (fix them); "
                        "failed and unknown (some slots' chunks refused after others were "
                        "stored) and over_quota: resend those after Retry-After, which is then "
                        "set",
                        "headers": RETRY_AFTER,
                        **json_content(results),
                    },
                },
                obj(
                    ["messages"],
                    messages=array(ref("ScheduleRequest"), MAX_BATCH, 1),
                    mode=MODE,
                ),
            )
        },
        messages + "/{id}": {
            "get": operation(
                "A message's state", ok("found", ref("Message")), None, [ID, SLOT_BASIS, SLOT]
            ),
            "delete": operation(
                "Cancel a message", ok("cancelled", ref("Outcome")), None, [ID, SLOT_BASIS, SLOT]
            ),
        },
        messages + "/{id}/reschedule": {
            "post": operation(
                "Move a message's due time",
                ok("rescheduled", ref("Outcome")),
                when([]),
                [ID, SLOT_BASIS, SLOT],
            ),
        },
        leases: {
            "post": operation(
                "Lease due messages (pull topics)",
                ok(
                    "leased messages, possibly none; with `ack`, a result per acked token "
                    "(a lost lease is reported in its result: the status stays 200)",
                    obj(
                        ["leases"],
                        leases=array(ref("Delivery"), MAX_LEASE_BATCH),
                        acks=array(ref("Outcome"), MAX_LEASE_BATCH),
                    ),
                ),
                {
                    **obj(
                        [],
                        max={
                            **integer(
                                "messages at most (and at most --pull-max-lease-batch); a "
                                "lease stops early once about 1 MiB of records is leased "
                                "(at least one message): lease again for the rest",
                                1,
                            ),
                            "maximum": MAX_LEASE_BATCH,
                            "default": 1,
                        },
                        **ack_timeout(
                            "lease length of each message leased; default the topic's "
                            "ackTimeout. A lease that runs out unacked counts as a failed "
                            "attempt and is retried after the topic's retry policy, as a nack "
                            "without delayMs"
                        ),
                        waitMs=integer(
                            "long poll: wait up to this long for something to be due (answered "
                            "as soon as something is; 0: answer at once)",
                            0,
                            MAX_WAIT_MS,
                        ),
                        ack=array(
                            string(f"{LEASE_TOKEN}; acked before leasing"),
                            MAX_LEASE_BATCH,
                        ),
                    ),
                    **NOT_BOTH_ACK_TIMEOUTS,
                },
            )
        },
        leases + "/ack": {
            "post": operation("Acknowledge leases", outcomes, obj(["tokens"], **TOKENS))
        },
        leases + "/nack": {
            "post": operation(
                "Retry leases later (or send them to dead)",
                outcomes,
                obj(
                    ["tokens"],
                    delayMs=integer(
                        "retry after this delay from the Redis server's now; without it, "
                        "the topic's retry policy: retry.backoffBase * "
                        "retry.backoffMultiplier^(attempt-1), capped at retry.backoffMax, "
                        "with retry.jitter full a random time up to that",
                        0,
                        MAX_DELAY_MS,
                    ),
                    reason=string(
                        f"why, kept with a dead message (its first {MAX_REASON_CHARS} characters)"
                    ),
                    dead={"type": "boolean", "description": "dead at once (poison message)"},
                    **TOKENS,
                ),
            )
        },
        leases + "/extend": {
            "post": operation(
                "Extend leases",
                outcomes,
                {
                    **obj(["tokens"], **ack_timeout("new lease length, from now"), **TOKENS),
                    "oneOf": [
                        {"required": [ACK_TIMEOUT_FIELD]},
                        {"required": [ACK_TIMEOUT_OLD_FIELD]},
                    ],
                },
            )
        },
        schedules: {
            "get": operation(
                "Every recurring schedule of the topic",
                ok(
                    "the schedules", obj(["schedules"], schedules=array(ref("Schedule"), 1_000_000))
                ),
            )
        },
        schedules + "/{id}": {
            "put": operation(
                "Create or replace a recurring schedule (its waiting occurrence is replaced)",
                {
                    **ok("created", ref("Schedule"), "201"),
                    **ok("replaced", ref("Schedule")),
                },
                ref("ScheduleDefinition"),
                [SCHEDULE_ID],
            ),
            "get": operation(
                "A recurring schedule", ok("found", ref("Schedule")), None, [SCHEDULE_ID]
            ),
            "delete": operation(
                "Delete a recurring schedule and its waiting occurrence",
                ok("deleted", ref("Outcome")),
                None,
                [SCHEDULE_ID],
            ),
        },
        dead: {
            "get": operation(
                "Page through dead messages",
                ok(
                    "a page",
                    obj(
                        ["messages", "nextCursor"],
                        messages=array(ref("Message"), MAX_PAGE),
                        nextCursor={"type": "string", "nullable": True},
                    ),
                ),
                None,
                [
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "<slot>:<offset>, as a previous page's nextCursor",
                        "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                    },
                    {"name": "count", "in": "query", "schema": integer("page size", 1, MAX_PAGE)},
                ],
            )
        },
        dead + "/redrive": {
            "post": operation(
                "Redrive dead messages",
                {
                    **ok(
                        "results",
                        {"oneOf": [ref("Outcomes"), obj(["moved"], moved=integer("moved"))]},
                    ),
                    **NOT_ALL_DEAD,
                },
                ref("Ids"),
            )
        },
        dead + "/purge": {
            "post": operation(
                "Delete dead messages",
                {
                    **ok(
                        "results",
                        {"oneOf": [ref("Outcomes"), obj(["moved"], moved=integer("deleted"))]},
                    ),
                    **NOT_ALL_DEAD,
                },
                ref("Ids"),
            )
        },
        "/v1/topics/{topic}/stats": {
            "get": operation(
                "Depths of the topic",
                ok(
                    "stats",
                    obj(
                        ["scheduled", "due", "prepared", "dead"],
                        scheduled=integer("waiting"),
                        due=integer("due, not yet claimed"),
                        prepared=integer("leased"),
                        dead=integer("dead"),
                        nextDueMs={"type": "integer", "nullable": True},
                        oldestOverdueMs=integer("age of the oldest due message"),
                        ownedSlots=array({"type": "integer"}, MAX_SLOT_AMOUNT),
                        paused={"type": "boolean"},
                    ),
                ),
            )
        },
        "/v1/topics/{topic}/pause": {
            "post": operation(
                "Pause delivery: claims stop within a second, scheduling goes on",
                ok("paused", obj(["paused"], paused={"type": "boolean"})),
            )
        },
        "/v1/topics/{topic}/resume": {
            "post": operation(
                "Resume delivery: the backlog drains under the usual flow control",
                ok("resumed", obj(["paused"], paused={"type": "boolean"})),
            )
        },
        "/v1/topics/{topic}/overview": {
            "get": operation(
                "The whole topic at a glance (read-only; at most a second old)",
                ok("overview", ref("Overview")),
            )
        },
        "/v1/topics/{topic}/slots": {
            "get": operation(
                "The slot map: owner, epoch and depths per slot, a page at a time (read-only)",
                ok("a page of slots", ref("SlotMap")),
                None,
                [
                    {
                        "name": "start",
                        "in": "query",
                        "description": "first slot of the page (a previous page's nextStart)",
                        "schema": slot_index("slot"),
                    },
                    {
                        "name": "count",
                        "in": "query",
                        "schema": integer("slots per page", 1, MAX_SLOT_PAGE),
                    },
                    {
                        "name": "only",
                        "in": "query",
                        "description": "attention: only stalled or unowned slots",
                        "schema": {"type": "string", "enum": ["all", "attention"]},
                    },
                ],
            )
        },
        "/v1/topics/{topic}/slots/heat": {
            "get": operation(
                "Every slot at once, a column per value: the dashboard's heat map (read-only)",
                ok("every slot", ref("SlotHeat")),
            )
        },
        "/ui": {"get": _ui("The dashboard page (HTML; it asks for a token before reading)")},
        "/ui/{asset}": {
            "get": {
                **_ui(
                    "A file of the dashboard (script, style sheet)",
                    ("text/javascript", "text/css", "image/svg+xml"),
                ),
                "parameters": [
                    {
                        "name": "asset",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
                    }
                ],
            }
        },
        "/healthz": {"get": _probe("Liveness")},
        "/readyz": {"get": _probe("Readiness: Redis connected and slots assigned (503 if not)")},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "description": "Open unless the service has a metrics token (--metrics-token; "
                "on Kubernetes always, the Secret's metrics-token); then it needs that token, "
                "an API token or the read token as the bearer token.",
                "security": [{}, {"bearer": []}],
                "responses": {
                    "200": {"description": "text exposition format"},
                    "401": {"$ref": "#/components/responses/Unauthorized"},
                },
            }
        },
    }


def _ui(summary: str, types: tuple[str, ...] = ("text/html",)) -> Schema:
    return {
        "summary": summary,
        "security": [],
        "responses": {
            "200": {"description": "the file", "content": {t: {} for t in types}},
            "404": {"$ref": "#/components/responses/NotFound"},
        },
    }


def _probe(summary: str) -> Schema:
    return {"summary": summary, "security": [], "responses": ok("ok", {"type": "object"})}


def openapi_document(slot_amount: int = MAX_SLOT_AMOUNT, topic: str | None = None) -> Schema:
    """The document; served, with the serving topic's name and `slot_amount`, so that every
    topic and slot bound is the one the server enforces."""
    document: Schema = {
        "openapi": "3.0.3",
        "info": {
            "title": "delayq delay service",
            "version": "1",
            "description": "Schedule messages for a future instant; lease, ack and inspect them.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the topic's API token (--api-token) or, during a rotation, "
                    "the previous one (--api-token-previous); none needed when the service has "
                    "no API token",
                }
            },
            "schemas": SCHEMAS,
            "responses": {
                "BadRequest": _error_response("a field is missing or invalid (see field)"),
                "Unauthorized": _error_response("missing or wrong bearer token"),
                "Forbidden": _error_response(
                    "the read-only token on a write, or a lease token this topic did not issue "
                    "(another topic's, altered, or unsigned; see field)"
                ),
                "NotFound": _error_response("unknown topic or message id"),
                "Conflict": _error_response("lease lost, fenced by a newer owner, wrong state"),
                "TooLarge": _error_response("body or payload over the limit"),
                "RequestTimeout": _error_response(
                    "the body did not arrive within the read timeout"
                ),
                "Unavailable": _error_response(
                    "Redis unreachable (the outcome of a write may be unknown)", RETRY_AFTER
                ),
                "BrokerFull": _error_response(
                    "the broker is full (Redis at maxmemory, noeviction), or the topic's "
                    "limits.maxPending is reached in the message's slot: nothing was stored; "
                    "retry after Retry-After, deliveries make room",
                    RETRY_AFTER,
                ),
            },
        },
    }
    served: Schema = _served(document, slot_amount, topic)
    return served


def _served(node: Any, slot_amount: int, topic: str | None) -> Any:
    """`node` with every slot number's maximum the topic's last slot and, given a topic, the
    topic path parameter that one name."""
    if isinstance(node, dict):
        bounded = {key: _served(value, slot_amount, topic) for key, value in node.items()}
        if node.get(SLOT_INDEX):
            bounded["maximum"] = slot_amount - 1
        if node.get(TOPIC_NAME) and topic is not None:
            bounded["enum"] = [topic]
        return bounded
    if isinstance(node, list):
        return [_served(item, slot_amount, topic) for item in node]
    return node


class _NoAliases(yaml.SafeDumper):
    """Shared sub-schemas are written out in full: a plain document, no YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def main() -> None:
    yaml.dump(openapi_document(), sys.stdout, Dumper=_NoAliases, sort_keys=False, width=100)


if __name__ == "__main__":
    main()
