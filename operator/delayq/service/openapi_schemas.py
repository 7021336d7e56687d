"""The OpenAPI document's named schemas (`components.schemas`): the bodies of requests and
answers, each in the terms of `openapi_parts` so that a bound is written once (pure).
"""

from __future__ import annotations

from delayq.queue.codec import MAX_PRIORITY
from delayq.queue.model import State
from delayq.queue.topic import MAX_DELAY_MS, MAX_SLOT_AMOUNT, TopicType
from delayq.service.openapi_parts import (
    BASE64_WHEN_SAID,
    GROUP_SCHEMA,
    ID_SCHEMA,
    MODE,
    PAYLOAD,
    RECURRENCE,
    Schema,
    array,
    at_most_one_expiry,
    integer,
    obj,
    ref,
    slot_index,
    string,
)
from delayq.service.overview import DUE_WINDOWS, MAX_LISTED, MAX_SLOT_PAGE, STALLED_AFTER_MS
from delayq.service.parsing import MAX_AT_MS, MAX_BATCH

#: What each occurrence of a recurring schedule carries besides its payload and headers.
SERIES_TAGS: dict[str, Schema] = {
    "priority": {
        **integer("every occurrence's priority (0, the default: none)", 0, MAX_PRIORITY),
        "default": 0,
    },
    "group": {**GROUP_SCHEMA, "description": "every occurrence's fair group (absent: none)"},
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
        [
            "id",
            "topic",
            "namespace",
            "payload",
            "encoding",
            "headers",
            "attempt",
            "dueMs",
            "priority",
        ],
        id=string(),
        topic=string(),
        namespace=string(),
        attempt=integer("1 for the first delivery", 1),
        dueMs=integer("due instant"),
        priority=integer("the priority it was scheduled with (0 when none)", 0, MAX_PRIORITY),
        group={
            **GROUP_SCHEMA,
            "description": "the fair group it was scheduled with; absent when it has none "
            "(an ungrouped message's body is unchanged)",
        },
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
        **obj([], **RECURRENCE, **SERIES_TAGS, **PAYLOAD),
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
            "priority",
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
        **SERIES_TAGS,
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
