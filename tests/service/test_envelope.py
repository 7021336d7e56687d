"""Payload envelopes: text or base64, webhook bodies, stream entries and header ids."""

from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.model import Message
from delayq.queue.topic import Topic
from delayq.service.delivery.stream import stream_fields
from delayq.service.envelope import decode_payload, encode_payload, header_id, message_body

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_payload_bytes=16)


def test_payloads_travel_as_text_or_base64():
    assert encode_payload("héllo".encode()) == ("héllo", "utf-8")
    text, encoding = encode_payload(b"\xff\x00")
    assert encoding == "base64"
    assert decode_payload(text, encoding) == b"\xff\x00"
    with pytest.raises(ValueError, match="base64"):
        decode_payload("***", "base64")


def test_webhook_body_and_stream_entry():
    message = Message("a", 2, b"\xff", {"k": "v"}, 3, 1234, 7, 9, priority=4)
    body = json.loads(message_body(TOPIC, message))
    assert body == {
        "id": "a",
        "topic": "orders",
        "namespace": "shop",
        "payload": "/w==",
        "encoding": "base64",
        "headers": {"k": "v"},
        "attempt": 3,
        "dueMs": 1234,
        "priority": 4,
    }
    fields = stream_fields(TOPIC, message)
    assert fields["payload"] == b"\xff"
    assert (fields["attempt"], fields["priority"]) == (3, 4)
    assert "group" not in body  # absent, not null, when none
    assert "group" not in fields


def test_a_grouped_message_tells_its_group_and_an_ungrouped_body_keeps_its_bytes():
    """The group travels in the body, the lease and the stream entry; without one the body is
    byte for byte the one receivers got before groups existed (signed, deduped, validated)."""
    message = Message("a", 2, b"hi", {}, 1, 1234, 7, 9)
    assert message_body(TOPIC, message) == (
        b'{"attempt":1,"dueMs":1234,"encoding":"utf-8","headers":{},"id":"a",'
        b'"namespace":"shop","payload":"hi","priority":0,"topic":"orders"}'
    )
    grouped = message._replace(group="customer:7 é")
    assert json.loads(message_body(TOPIC, grouped))["group"] == "customer:7 é"
    assert stream_fields(TOPIC, grouped)["group"] == "customer:7 é"


@given(st.text(min_size=1))
def test_header_ids_are_ascii_and_decode_back(message_id):
    value = header_id(message_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    assert value.isascii()
    assert all("!" <= c <= "~" for c in value)  # no space, nothing a header parser strips
    assert unquote(value) == message_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def test_header_ids_keep_plain_ids_and_escape_the_escape():
    assert header_id("order-42/a{b}") == "order-42/a{b}"
    assert (header_id("é 1"), header_id("%41")) == ("%C3%A9%201", "%2541")
