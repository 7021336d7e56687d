"""The OpenAPI 3 document of the HTTP API, built as data (pure).

Served at `/openapi.json` and checked into `docs/openapi.yaml`; regenerate the latter with
`python -m delayq.service.openapi > docs/openapi.yaml` (a test asserts the two are equal).
Every bound comes from the constant the parser enforces (`parsing`, `topic`), so the document
cannot promise what the server refuses.

This module assembles the document and states the serving topic's bounds in it; its parts are
one module per concern: `openapi_parts` (parameters and schema constructors),
`openapi_schemas` (the named bodies) and `openapi_paths` (the operations).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from delayq.queue.topic import MAX_SLOT_AMOUNT
from delayq.service.openapi_parts import (
    RETRY_AFTER,
    SLOT_INDEX,
    TOPIC_NAME,
    Schema,
    json_content,
    ref,
)
from delayq.service.openapi_paths import paths
from delayq.service.openapi_schemas import SCHEMAS


def _error_response(description: str, headers: Schema | None = None) -> Schema:
    response = {"description": description, **json_content(ref("Error"))}
    if headers:
        response["headers"] = headers
    return response


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
        "paths": paths(),
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
