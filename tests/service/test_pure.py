"""Pure pieces: lease tokens, signatures, payload envelopes, request parsing, pull shares."""

from __future__ import annotations

import json
import logging
import sys
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.model import Lease, Message
from delayq.queue.topic import Topic
from delayq.service.delivery.pull import _shares
from delayq.service.delivery.signing import sign, verify
from delayq.service.delivery.stream import stream_fields
from delayq.service.envelope import decode_payload, encode_payload, header_id, message_body
from delayq.service.logs import JsonFormatter
from delayq.service.parsing import (
    FieldError,
    PayloadTooLargeError,
    parse_all_or_ids,
    parse_batch,
    parse_cursor,
    parse_lease_request,
    parse_message,
    parse_nack,
    parse_target,
    parse_tokens,
)
from delayq.service.tokens import TokenError, decode_token, encode_token

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_payload_bytes=16)


@given(
    slot=st.integers(0, 16383),
    epoch=st.integers(0, 2**40),
    attempt=st.integers(1, 1000),
    message_id=st.text(min_size=1, max_size=64),
)
def test_tokens_round_trip(slot, epoch, attempt, message_id):
    lease = Lease(slot, message_id, attempt, epoch)
    token = encode_token(lease)
    assert token.isascii()
    assert decode_token(token) == lease


@pytest.mark.parametrize(
    "token", ["", "!!!", "bm90IGEgdG9rZW4", encode_token(Lease(1, "a", 1, 1))[:-3]]
)
def test_malformed_tokens_are_refused(token):
    with pytest.raises(TokenError):
        decode_token(token)


def test_signature_verifies_and_detects_tampering():
    body = b'{"id":"a"}'
    header = sign("s3cret", body, 1_000_000)
    assert header.startswith("t=1000000,v1=")
    assert verify("s3cret", header, body, now_ms=1_000_500)
    assert not verify("s3cret", header, body + b" ", now_ms=1_000_500)
    assert not verify("other", header, body, now_ms=1_000_500)
    assert not verify("s3cret", header, body, now_ms=1_000_000 + 10 * 60 * 1000)  # replayed
    assert not verify("s3cret", "garbage", body, now_ms=1_000_000)


def test_payloads_travel_as_text_or_base64():
    assert encode_payload("héllo".encode()) == ("héllo", "utf-8")
    text, encoding = encode_payload(b"\xff\x00")
    assert encoding == "base64"
    assert decode_payload(text, encoding) == b"\xff\x00"
    with pytest.raises(ValueError, match="base64"):
        decode_payload("***", "base64")


def test_webhook_body_and_stream_entry():
    message = Message("a", 2, b"\xff", {"k": "v"}, 3, 1234, 7, 9)
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
    }
    fields = stream_fields(TOPIC, message)
    assert fields["payload"] == b"\xff"
    assert fields["attempt"] == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"delayMs": 5}, "id"),
        ({"id": "a"}, "delayMs"),
        ({"id": "a", "delayMs": 5, "atMs": 6}, "delayMs"),
        ({"id": "a", "delayMs": "5"}, "delayMs"),
        ({"id": "a", "delayMs": -1}, "delayMs"),
        ({"id": "a", "delayMs": True}, "delayMs"),
        ({"id": 7, "delayMs": 5}, "id"),
        ({"id": "", "delayMs": 5}, "id"),
        ({"id": "a", "delayMs": 5, "headers": {"k": 1}}, "headers"),
        ({"id": "a", "delayMs": 5, "encoding": "rot13"}, "encoding"),
        ({"id": "a", "delayMs": 5, "payload": "%", "encoding": "base64"}, "payload"),
        ({"id": "a", "delayMs": 5, "payload": 5}, "payload"),
    ],
)
def test_bad_messages_name_the_field(body, field):
    with pytest.raises(FieldError) as caught:
        parse_message(body, TOPIC)
    assert caught.value.field == field
    assert caught.value.status == 400


def test_payload_over_the_topic_limit_is_413():
    with pytest.raises(PayloadTooLargeError) as caught:
        parse_message({"id": "a", "delayMs": 1, "payload": "x" * 17}, TOPIC)
    assert (caught.value.field, caught.value.status) == ("payload", 413)


def test_batch_errors_carry_the_index():
    with pytest.raises(FieldError) as caught:
        parse_batch({"messages": [{"id": "a", "delayMs": 1}, {"id": "b"}]}, TOPIC)
    assert caught.value.field == "messages[1].delayMs"
    with pytest.raises(FieldError, match="1 to 1000"):
        parse_batch({"messages": []}, TOPIC)


def test_lease_and_nack_requests():
    wanted = parse_lease_request({}, TOPIC)
    assert (wanted.max_count, wanted.lease_ms, wanted.wait_ms) == (1, TOPIC.ack_timeout_ms, 0)
    with pytest.raises(FieldError) as caught:
        parse_lease_request({"max": 1001}, TOPIC)
    assert caught.value.field == "max"
    token = encode_token(Lease(1, "a", 2, 3))
    [retry] = parse_nack({"tokens": [token], "delayMs": 500, "dead": True}, TOPIC)
    assert (retry.lease, retry.backoff_ms, retry.kill) == (Lease(1, "a", 2, 3), 500, True)
    with pytest.raises(FieldError) as caught:
        parse_nack({"tokens": [token, "nope"]}, TOPIC)
    assert caught.value.field == "tokens[1]"


def test_dead_targets_and_cursor():
    assert parse_all_or_ids({"all": True}) is None
    targets = parse_all_or_ids({"ids": ["a", {"id": "b", "slotBasis": "k"}]})
    assert [(t.id, t.slot_basis) for t in targets or []] == [("a", None), ("b", "k")]
    assert parse_cursor("2:5", TOPIC) == (2, 5)
    with pytest.raises(FieldError, match="cursor"):
        parse_cursor("9:0", TOPIC)


@given(total=st.integers(1, 5000), parts=st.integers(1, 300))
def test_shares_add_up_exactly(total, parts):
    shares = _shares(total, parts)
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_json_log_lines_carry_extra_fields_and_exceptions():
    record = logging.makeLogRecord(
        {"name": "delayq.x", "levelname": "WARNING", "msg": "slot %d lost", "args": (3,), "slot": 3}
    )
    line = json.loads(JsonFormatter().format(record))
    assert (line["msg"], line["level"], line["slot"]) == ("slot 3 lost", "WARNING", 3)
    assert line["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exc"]


@given(st.text(min_size=1))
def test_header_ids_are_ascii_and_decode_back(message_id):
    value = header_id(message_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    assert value.isascii()
    assert all("!" <= c <= "~" for c in value)  # no space, nothing a header parser strips
    assert unquote(value) == message_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def test_header_ids_keep_plain_ids_and_escape_the_escape():
    assert header_id("order-42/a{b}") == "order-42/a{b}"
    assert (header_id("é 1"), header_id("%41")) == ("%C3%A9%201", "%2541")


@pytest.mark.parametrize("bad", ["a\x00", "a\r\nX-Evil: 1", "a\x7f", "a\x85", "\ud800"])
@pytest.mark.parametrize("field", ["id", "slotBasis"])
def test_ids_and_slot_bases_refuse_control_characters_and_lone_surrogates(bad, field):
    body = {"id": "a", "delayMs": 1, field: bad}
    with pytest.raises(FieldError) as caught:
        parse_message(body, TOPIC)
    assert caught.value.field == field
    assert "control character" in str(caught.value) or "surrogate" in str(caught.value)
    with pytest.raises(FieldError) as caught:
        parse_all_or_ids({"ids": [{"id": "a", field: bad}]})
    assert caught.value.field == f"ids[0].{field}"
    with pytest.raises(FieldError):
        parse_target(bad, None) if field == "id" else parse_target("a", bad)


def test_lone_surrogates_anywhere_in_text_are_400():
    for body, field in [
        ({"id": "a", "delayMs": 1, "payload": "\ud800"}, "payload"),
        ({"id": "a", "delayMs": 1, "headers": {"k": "\udfff"}}, "headers.k"),
        ({"id": "a", "delayMs": 1, "headers": {"\udfff": "v"}}, "headers"),
    ]:
        with pytest.raises(FieldError) as caught:
            parse_message(body, TOPIC)
        assert caught.value.field == field


def test_one_id_with_two_slot_bases_in_a_batch_is_refused():
    same = [{"id": "a", "delayMs": 1, "slotBasis": "x"}, {"id": "a", "delayMs": 1}]
    with pytest.raises(FieldError, match="one id, one slot basis") as caught:
        parse_batch({"messages": same}, TOPIC)
    assert caught.value.field == "messages[1].slotBasis"
    twice = [{"id": "a", "delayMs": 1, "slotBasis": "x"}] * 2
    assert len(parse_batch({"messages": twice}, TOPIC)) == 2


@pytest.mark.parametrize("slot", [-1, 4, 10**6])
def test_forged_token_slots_are_400(slot):
    token = encode_token(Lease(slot, "a", 1, 1))
    with pytest.raises(FieldError, match=r"outside 0\.\.3") as caught:
        parse_tokens({"tokens": [token]}, TOPIC)
    assert caught.value.field == "tokens[0]"


@pytest.mark.parametrize(
    "cursor",
    ["1e20", "0:100000000000000000000", "0:-1", "-1:0", " 1:0", "+1:0", "1:\u0665", "0:0:0"],
)
def test_malformed_cursors_are_400(cursor):
    with pytest.raises(FieldError, match="cursor"):
        parse_cursor(cursor, TOPIC)
