"""Request parsing: every bad input names its field and maps to a 4xx."""

from __future__ import annotations

import pytest

from delayq.queue.model import Lease, Target
from delayq.queue.topic import Topic
from delayq.service.parsing import (
    FieldError,
    PayloadTooLargeError,
    parse_batch,
    parse_cursor,
    parse_dead_targets,
    parse_extend,
    parse_lease_request,
    parse_message,
    parse_nack,
    parse_target,
)
from delayq.service.tokens import LeaseTokens

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_payload_bytes=16)


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
        ({"id": "a", "delayMs": 5, "headers": None}, "headers"),  # null is not "none given"
        ({"id": "a", "delayMs": 5, "headers": []}, "headers"),
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
    tokens = LeaseTokens(b"key", TOPIC.namespace, TOPIC.name)
    wanted = parse_lease_request({}, TOPIC, tokens)
    assert (wanted.max_count, wanted.ack_timeout_ms, wanted.wait_ms) == (1, TOPIC.ack_timeout_ms, 0)
    with pytest.raises(FieldError) as caught:
        parse_lease_request({"max": 1001}, TOPIC, tokens)
    assert caught.value.field == "max"
    token = tokens.encode(Lease(1, "a", 2, 3))
    nack = parse_nack({"tokens": [token], "delayMs": 500, "dead": True}, TOPIC, tokens)
    assert (nack.leases, nack.delay_ms, nack.dead) == ([(Lease(1, "a", 2, 3), 0)], 500, True)
    with pytest.raises(FieldError) as caught:
        parse_nack({"tokens": [token, "nope"]}, TOPIC, tokens)
    assert caught.value.field == "tokens[1]"


def test_the_lease_length_keeps_its_old_field_name_for_one_release():
    """`ackTimeoutMs` was `leaseMs`: a client not upgraded yet is still served, an error names
    the field it sent, and both at once are refused rather than one silently chosen."""
    tokens = LeaseTokens(b"key", TOPIC.namespace, TOPIC.name)
    token = tokens.encode(Lease(1, "a", 2, 3))
    for name in ("ackTimeoutMs", "leaseMs"):
        assert parse_lease_request({name: 500}, TOPIC, tokens).ack_timeout_ms == 500
        assert parse_extend({"tokens": [token], name: 700}, TOPIC, tokens)[1] == 700
        with pytest.raises(FieldError) as caught:
            parse_lease_request({name: 0}, TOPIC, tokens)
        assert caught.value.field == name
    with pytest.raises(FieldError, match="leaseMs is the old name of ackTimeoutMs") as caught:
        parse_lease_request({"leaseMs": 5, "ackTimeoutMs": 5}, TOPIC, tokens)
    assert caught.value.field == "leaseMs"
    with pytest.raises(FieldError) as caught:
        parse_extend({"tokens": [token]}, TOPIC, tokens)  # required: named by its new name
    assert caught.value.field == "ackTimeoutMs"


def test_dead_targets_and_cursor():
    assert parse_dead_targets({"all": True}, TOPIC) is None
    with pytest.raises(FieldError, match="ids or all, not both"):  # ids were ignored
        parse_dead_targets({"all": True, "ids": [5]}, TOPIC)
    body = {"ids": ["a", {"id": "b", "slotBasis": "k"}, {"id": "c", "slot": 3}]}
    assert parse_dead_targets(body, TOPIC) == [
        Target("a"),
        Target("b", "k"),
        Target("c", explicit_slot=3),  # as a dead page reports it: no slot basis needed
    ]
    assert parse_cursor("2:5", TOPIC) == (2, 5)
    assert parse_cursor(None, TOPIC) == (0, 0)
    # past the last slot: the end (an empty last page), as the served OpenAPI's pattern allows
    assert parse_cursor("9:0", TOPIC) == (4, 0)


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"id": "c", "slot": 4}, "ids[0].slot"),
        ({"id": "c", "slot": "3"}, "ids[0].slot"),
        ({"id": "c", "slot": 3, "slotBasis": "k"}, "ids[0].slot"),
        ({"slot": 3}, "ids[0].id"),
    ],
)
def test_dead_targets_refuse_a_slot_outside_the_topic_or_beside_a_basis(item, field):
    with pytest.raises(FieldError) as caught:
        parse_dead_targets({"ids": [item]}, TOPIC)
    assert caught.value.field == field


def test_a_path_target_takes_the_slot_that_holds_it():
    assert parse_target("c", None, "3", TOPIC) == Target("c", explicit_slot=3)
    assert parse_target("c", "k", None, TOPIC) == Target("c", "k")
    assert parse_target("c", None, None, TOPIC).slot(TOPIC) == TOPIC.slot_of("c")


@pytest.mark.parametrize(
    ("basis", "slot"),
    [(None, "4"), (None, "-1"), (None, "+3"), (None, " 3"), (None, "x"), (None, ""), ("k", "3")],
)
def test_a_path_slot_outside_the_topic_or_beside_a_basis_is_refused(basis, slot):
    with pytest.raises(FieldError) as caught:
        parse_target("c", basis, slot, TOPIC)
    assert (caught.value.field, caught.value.status) == ("slot", 400)


@pytest.mark.parametrize("bad", ["a\x00", "a\r\nX-Evil: 1", "a\x7f", "a\x85", "\ud800"])
@pytest.mark.parametrize("field", ["id", "slotBasis"])
def test_ids_and_slot_bases_refuse_control_characters_and_lone_surrogates(bad, field):
    body = {"id": "a", "delayMs": 1, field: bad}
    with pytest.raises(FieldError) as caught:
        parse_message(body, TOPIC)
    assert caught.value.field == field
    assert "control character" in str(caught.value) or "surrogate" in str(caught.value)
    with pytest.raises(FieldError) as caught:
        parse_dead_targets({"ids": [{"id": "a", field: bad}]}, TOPIC)
    assert caught.value.field == f"ids[0].{field}"
    with pytest.raises(FieldError):
        parse_target(bad, None, None, TOPIC) if field == "id" else parse_target(
            "a", bad, None, TOPIC
        )


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


def test_one_id_twice_in_a_batch_is_refused():
    """Regression: the same (basis, id) twice was accepted: create mode stored the first and
    answered the second `exists` as if it had been there before (its payload dropped)."""
    twice = [{"id": "b", "delayMs": 1}, {"id": "a", "delayMs": 1, "slotBasis": "x"},
             {"id": "a", "delayMs": 2, "slotBasis": "x", "payload": "other"}]
    with pytest.raises(FieldError, match=r"repeats messages\[1\]\.id") as caught:
        parse_batch({"messages": twice}, TOPIC)
    assert caught.value.field == "messages[2].id"


@pytest.mark.parametrize(
    "cursor",
    ["", "1e20", "0:100000000000000000000", "0:-1", "-1:0", " 1:0", "+1:0", "1:\u0665", "0:0:0"],
)
def test_malformed_cursors_are_400(cursor):
    with pytest.raises(FieldError, match="cursor"):
        parse_cursor(cursor, TOPIC)
