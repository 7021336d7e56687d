"""The OpenAPI document's paths: one operation per route the service serves (pure).

Kept apart from the schemas they refer to (`ref`): an operation says which body and answers a
route has, a schema what such a body holds. A test compares these paths with the routes the
application registers, so a route cannot be left out.
"""

from __future__ import annotations

from delayq.queue.topic import MAX_DELAY_MS, MAX_SLOT_AMOUNT
from delayq.service.delivery.pull import MAX_LEASE_BATCH
from delayq.service.openapi_parts import (
    ID,
    LEASE_TOKEN,
    MODE,
    NOT_BOTH_ACK_TIMEOUTS,
    RETRY_AFTER,
    SCHEDULE_ID,
    SLOT,
    SLOT_BASIS,
    TOKENS,
    Schema,
    ack_timeout,
    array,
    integer,
    json_content,
    obj,
    ok,
    operation,
    ref,
    slot_index,
    string,
    when,
)
from delayq.service.overview import MAX_SLOT_PAGE
from delayq.service.parsing import (
    ACK_TIMEOUT_FIELD,
    ACK_TIMEOUT_OLD_FIELD,
    CURSOR_PATTERN,
    MAX_BATCH,
    MAX_PAGE,
    MAX_REASON_CHARS,
    MAX_WAIT_MS,
)

NOT_ALL_DEAD = {
    "404": {
        "description": "a listed id is not dead (unknown, forgotten or live: result "
        "wrong_state); the others' results say what was done. Or an unknown topic (Error)",
        **json_content({"oneOf": [ref("Outcomes"), ref("Error")]}),
    }
}


def paths() -> dict[str, Schema]:
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
