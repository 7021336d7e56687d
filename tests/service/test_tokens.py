"""Lease tokens: round trips, and refusal of malformed or forged ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.model import Lease
from delayq.queue.topic import Topic
from delayq.service.parsing import (
    FieldError,
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


@pytest.mark.parametrize("slot", [-1, 4, 10**6])
def test_forged_token_slots_are_400(slot):
    token = encode_token(Lease(slot, "a", 1, 1))
    with pytest.raises(FieldError, match=r"outside 0\.\.3") as caught:
        parse_tokens({"tokens": [token]}, TOPIC)
    assert caught.value.field == "tokens[0]"
