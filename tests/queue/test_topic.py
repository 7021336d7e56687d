"""Topic validation and slot routing (pure)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.keys import Part, parse_wake_key, slot_keys
from delayq.queue.topic import Topic, TopicError, TopicType, slot_of


def test_slot_is_crc32_masked_with_known_vectors() -> None:
    # CRC-32/IEEE check value of "123456789" is 0xCBF43926 in every conforming implementation.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert slot_of("123456789", 16384) == 0xCBF43926 & 16383
    assert slot_of("123456789", 1) == 0
    assert slot_of(b"123456789", 8) == 0xCBF43926 & 7


@given(st.text(min_size=1), st.sampled_from([1, 2, 4, 1024, 16384]))
def test_slot_in_range_and_str_equals_utf8_bytes(basis: str, slot_amount: int) -> None:
    slot = slot_of(basis, slot_amount)
    assert 0 <= slot < slot_amount
    assert slot == slot_of(basis.encode(), slot_amount)


@pytest.mark.parametrize("slot_amount", [0, 3, 6, 100, 32768, -4])
def test_slot_amount_must_be_power_of_two_in_range(slot_amount: int) -> None:
    with pytest.raises(TopicError, match=r"slotAmount .* power of two between 1 and 16384"):
        Topic("orders", slot_amount=slot_amount)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "Orders", "topic name"),
        ("name", "", "topic name"),
        ("namespace", "a_b", "topic namespace"),
        ("max_retries", -1, "maxRetries"),
        ("ack_timeout_ms", 0, "ackTimeout"),
        ("max_payload_bytes", 0, "maxPayloadBytes"),
    ],
)
def test_invalid_settings_name_the_setting(field: str, value: object, message: str) -> None:
    settings: dict[str, object] = {"name": "orders", field: value}
    with pytest.raises(TopicError, match=message):
        Topic(**settings)  # type: ignore[arg-type]


def test_topic_type_is_parsed_and_checked() -> None:
    assert Topic("t", topic_type="webhook").topic_type is TopicType.WEBHOOK  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="carrier"):
        Topic("t", topic_type="carrier")  # type: ignore[arg-type]


def test_keys_share_one_hash_tag_per_slot() -> None:
    keys = slot_keys(Topic("orders", namespace="shop", slot_amount=8), 5)
    assert keys.key(Part.STORE) == "dq:{shop/orders/5}:store"
    assert {k.split(":")[1] for k in keys.keys(*Part)} == {"{shop/orders/5}"}
    assert parse_wake_key(keys.key(Part.WAKE)) == 5
    with pytest.raises(ValueError, match=r"slot 8 is outside 0\.\.7"):
        slot_keys(Topic("orders", slot_amount=8), 8)
