"""The OpenAPI 3 document of the HTTP API, built as data (pure).

Served at `/openapi.json` and checked into `docs/openapi.yaml`; regenerate the latter with
`python -m delayq.service.openapi > docs/openapi.yaml` (a test asserts the two are equal).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

Schema = dict[str, Any]

TOPIC = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}}
ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
SLOT_BASIS = {
    "name": "slotBasis",
    "in": "query",
    "required": False,
    "description": "the slot basis the message was scheduled with, if not its id",
    "schema": {"type": "string"},
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(required: list[str], **properties: Schema) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def integer(description: str, minimum: int = 0) -> Schema:
    return {"type": "integer", "minimum": minimum, "description": description}


def string(description: str = "") -> Schema:
    return {"type": "string", "description": description} if description else {"type": "string"}


def array(items: Schema, max_items: int = 1000) -> Schema:
    return {"type": "array", "items": items, "maxItems": max_items}


def json_content(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def ok(description: str, schema: Schema, status: str = "200") -> Schema:
    return {status: {"description": description, **json_content(schema)}}


ERRORS: Schema = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "404": {"$ref": "#/components/responses/NotFound"},
    "409": {"$ref": "#/components/responses/Conflict"},
    "413": {"$ref": "#/components/responses/TooLarge"},
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
        "responses": {**responses, **ERRORS},
    }
    if body is not None:
        op["requestBody"] = {"required": True, **json_content(body)}
    return op


WHEN = {
    "delayMs": integer("delay from the Redis server's now; exactly one of delayMs and atMs"),
    "atMs": integer("instant, Unix epoch milliseconds; exactly one of delayMs and atMs"),
}
PAYLOAD = {
    "payload": string("UTF-8 text, or base64 when encoding is base64"),
    "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
}
TOKENS = {"tokens": array(string("lease token from a lease answer"))}

SCHEMAS: dict[str, Schema] = {
    "Error": obj(["error"], error=string(), field=string("the request field at fault")),
    "ScheduleRequest": obj(
        ["id"],
        id=string("message id (idempotency key), 1..256 bytes"),
        slotBasis=string("routes the message instead of its id"),
        mode={"type": "string", "enum": ["create", "upsert"], "default": "create"},
        **WHEN,
        **PAYLOAD,
    ),
    "ScheduleResult": obj(
        ["id", "slot", "result", "dueMs", "state"],
        id=string(),
        slot=integer("slot of the message"),
        result={"type": "string", "enum": ["created", "exists", "updated"]},
        dueMs=integer("due instant, server epoch ms"),
        state=string(),
    ),
    "Message": obj(
        ["id", "slot", "state", "attempts", "payload", "encoding", "headers"],
        id=string(),
        slot=integer("slot"),
        state={"type": "string", "enum": ["scheduled", "prepared", "dead"]},
        attempts=integer("deliveries so far"),
        dueMs=integer("due instant"),
        leaseDeadlineMs=integer("lease deadline while prepared"),
        diedMs=integer("time of death while dead"),
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
        token=string("pull leases only: present it to ack, nack or extend"),
        **PAYLOAD,
    ),
    "Outcome": obj(
        ["id", "result"],
        id=string(),
        result=string("e.g. acked, retry_scheduled, dead, extended, lease_lost, stale_epoch"),
        atMs=integer("new due time (nack) or lease deadline (extend)"),
        token=string(),
    ),
    "Outcomes": obj(["results"], results=array(ref("Outcome"))),
    "Ids": obj(
        [],
        ids=array(
            {"oneOf": [string(), obj(["id"], id=string(), slotBasis=string())]},
        ),
        all={"type": "boolean", "description": "every dead message instead of ids"},
    ),
}


def _error_response(description: str) -> Schema:
    return {"description": description, **json_content(ref("Error"))}


def _paths() -> dict[str, Schema]:
    messages = "/v1/topics/{topic}/messages"
    leases = "/v1/topics/{topic}/leases"
    dead = "/v1/topics/{topic}/dead"
    outcomes = ok("one result per token; 409 when any lease was lost", ref("Outcomes"))
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
                "Schedule up to 1000 messages",
                ok(
                    "a result per message, in order",
                    obj(["results"], results=array(ref("ScheduleResult"))),
                ),
                obj(["messages"], messages=array(ref("ScheduleRequest")), mode=string()),
            )
        },
        messages + "/{id}": {
            "get": operation(
                "A message's state", ok("found", ref("Message")), None, [ID, SLOT_BASIS]
            ),
            "delete": operation(
                "Cancel a message", ok("cancelled", ref("Outcome")), None, [ID, SLOT_BASIS]
            ),
        },
        messages + "/{id}/reschedule": {
            "post": operation(
                "Move a message's due time",
                ok("rescheduled", ref("Outcome")),
                obj([], **WHEN),
                [ID, SLOT_BASIS],
            ),
        },
        leases: {
            "post": operation(
                "Lease due messages (pull topics)",
                ok(
                    "leased messages, possibly none", obj(["leases"], leases=array(ref("Delivery")))
                ),
                obj(
                    [],
                    max={**integer("messages at most", 1), "maximum": 1000, "default": 1},
                    leaseMs=integer("lease length; default the topic's ackTimeout", 1),
                    waitMs={**integer("long poll when nothing is due"), "maximum": 30000},
                ),
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
                    delayMs=integer("retry after this delay"),
                    reason=string("why, kept with a dead message"),
                    dead={"type": "boolean", "description": "dead at once (poison message)"},
                    **TOKENS,
                ),
            )
        },
        leases + "/extend": {
            "post": operation(
                "Extend leases",
                outcomes,
                obj(["tokens", "leaseMs"], leaseMs=integer("new lease length", 1), **TOKENS),
            )
        },
        dead: {
            "get": operation(
                "Page through dead messages",
                ok(
                    "a page",
                    obj(
                        ["messages", "nextCursor"],
                        messages=array(ref("Message")),
                        nextCursor={"type": "string", "nullable": True},
                    ),
                ),
                None,
                [
                    {"name": "cursor", "in": "query", "schema": string("<slot>:<offset>")},
                    {
                        "name": "count",
                        "in": "query",
                        "schema": {**integer("page size", 1), "maximum": 1000},
                    },
                ],
            )
        },
        dead + "/redrive": {
            "post": operation(
                "Redrive dead messages",
                ok("results", {"oneOf": [ref("Outcomes"), obj(["moved"], moved=integer("moved"))]}),
                ref("Ids"),
            )
        },
        dead + "/purge": {
            "post": operation(
                "Delete dead messages",
                ok(
                    "results",
                    {"oneOf": [ref("Outcomes"), obj(["moved"], moved=integer("deleted"))]},
                ),
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
                        ownedSlots=array({"type": "integer"}, 16384),
                    ),
                ),
            )
        },
        "/healthz": {"get": _probe("Liveness")},
        "/readyz": {"get": _probe("Readiness: Redis connected and slots assigned (503 if not)")},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "security": [],
                "responses": {"200": {"description": "text exposition format"}},
            }
        },
    }


def _probe(summary: str) -> Schema:
    return {"summary": summary, "security": [], "responses": ok("ok", {"type": "object"})}


def openapi_document() -> Schema:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "delayq delay service",
            "version": "1",
            "description": "Schedule messages for a future instant; lease, ack and inspect them.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
            "responses": {
                "BadRequest": _error_response("a field is missing or invalid (see field)"),
                "Unauthorized": _error_response("missing or wrong bearer token"),
                "NotFound": _error_response("unknown topic or message id"),
                "Conflict": _error_response("lease lost, fenced by a newer owner, wrong state"),
                "TooLarge": _error_response("body or payload over the limit"),
            },
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Shared sub-schemas are written out in full: a plain document, no YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def main() -> None:
    yaml.dump(openapi_document(), sys.stdout, Dumper=_NoAliases, sort_keys=False, width=100)


if __name__ == "__main__":
    main()
