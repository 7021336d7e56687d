"""Lease tokens: round trips, refusal of malformed, foreign, forged and unsigned ones, the key
generation."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.model import Lease
from delayq.queue.topic import Topic
from delayq.service.config import ServiceConfig
from delayq.service.parsing import FieldError, ForbiddenFieldError, parse_tokens
from delayq.service.tokens import (
    LeaseTokens,
    TokenError,
    TokenLease,
    TokenRefusedError,
    derived_key,
)

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_payload_bytes=16)
KEY = b"k" * 32
TOKENS = LeaseTokens(KEY, "shop", "orders")
LEASE = Lease(1, "a", 2, 3)


def unsigned(lease: Lease, version: int = 2) -> str:
    """A token without a MAC: version 1 (0.1.0, an attempt where the lease number is) or 2
    (never released)."""
    raw = f"{version}:{lease.slot}:{lease.epoch}:{lease.lease_id}:{lease.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@given(
    slot=st.integers(0, 16383),
    epoch=st.integers(0, 2**40),
    lease_id=st.integers(1, 2**40),
    message_id=st.text(min_size=1, max_size=64),
    generation=st.integers(0, 14),
)
def test_tokens_round_trip(slot, epoch, lease_id, message_id, generation):
    lease = Lease(slot, message_id, lease_id, epoch)
    token = TOKENS.encode(lease, generation)
    assert token.isascii()
    assert TOKENS.decode(token, 0) == (lease, generation)


@pytest.mark.parametrize(
    "token", ["", "!!!", "bm90IGEgdG9rZW4", "bm90IGEgdG9rZW4.AAAA", TOKENS.encode(LEASE)[5:]]
)
def test_malformed_tokens_are_refused(token):
    with pytest.raises(TokenError) as raised:
        TOKENS.decode(token, 0)
    assert not isinstance(raised.value, TokenRefusedError)


@pytest.mark.parametrize(
    "issuer",
    [
        LeaseTokens(KEY, "shop", "invoices"),  # another topic of the namespace
        LeaseTokens(KEY, "other", "orders"),  # the same name in another namespace
        LeaseTokens(b"another key", "shop", "orders"),  # not the topic's key
    ],
)
def test_a_token_of_another_topic_or_key_is_refused_naming_the_topic(issuer: LeaseTokens):
    with pytest.raises(TokenRefusedError, match=r"not issued by topic shop/orders"):
        TOKENS.decode(issuer.encode(LEASE), 0)


def test_an_altered_token_is_refused():
    """Each field is under the MAC: a consumer cannot point its token at another lease."""
    fields, mac = TOKENS.encode(LEASE).split(".")
    others = (Lease(2, "a", 2, 3), Lease(1, "b", 2, 3), Lease(1, "a", 9, 3), Lease(1, "a", 2, 4))
    for other in others:
        altered = TOKENS.encode(other).split(".")[0] + "." + mac
        with pytest.raises(TokenRefusedError):
            TOKENS.decode(altered, 0)
    flipped = mac[:-2] + ("AA" if mac[-2:] != "AA" else "BA")
    with pytest.raises(TokenRefusedError):
        TOKENS.decode(f"{fields}.{flipped}", 0)
    with pytest.raises(TokenRefusedError):
        TOKENS.decode(f"{fields}.", 0)  # version 3 without its MAC


@pytest.mark.parametrize("version", [1, 2])
def test_unsigned_tokens_are_refused(version):
    """Whenever the process started: no window after a start reopens on every restart."""
    with pytest.raises(TokenRefusedError, match=r"unsigned .* lease the message again"):
        TOKENS.decode(unsigned(LEASE, version), 0)
    with pytest.raises(ForbiddenFieldError, match=r"tokens\[0\]: lease token .* unsigned"):
        parse_tokens({"tokens": [unsigned(LEASE, version)]}, TOPIC, TOKENS)


def test_the_key_is_the_settings_or_derived_from_the_api_token():
    """Processes sharing a key (or, without one, an API token) accept each other's tokens."""
    config = ServiceConfig(namespace="shop", topic="orders", api_token="tok")
    token = config.lease_tokens().encode(LEASE)
    assert LeaseTokens(derived_key("tok"), "shop", "orders").decode(token, 0) == (LEASE, 0)
    with pytest.raises(TokenRefusedError):
        LeaseTokens(derived_key("other"), "shop", "orders").decode(token, 0)
    keyed = ServiceConfig(namespace="shop", topic="orders", api_token="tok", lease_token_key="s")
    keyed_token = keyed.lease_tokens().encode(LEASE)
    assert LeaseTokens(b"s", "shop", "orders").decode(keyed_token, 0) == (LEASE, 0)


def test_a_foreign_token_is_a_403_naming_the_field():
    foreign = LeaseTokens(KEY, "shop", "invoices").encode(LEASE)
    with pytest.raises(ForbiddenFieldError, match=r"tokens\[1\]: lease token .* not issued") as e:
        parse_tokens({"tokens": [TOKENS.encode(LEASE), foreign]}, TOPIC, TOKENS)
    assert (e.value.field, e.value.status) == ("tokens[1]", 403)


@pytest.mark.parametrize("slot", [-1, 4, 10**6])
def test_token_slots_outside_the_topic_are_400(slot):
    """The slot is checked whatever the MAC says: its keys do not exist outside the topic's."""
    with pytest.raises(FieldError, match=r"outside 0\.\.3") as caught:
        parse_tokens({"tokens": [TOKENS.encode(Lease(slot, "a", 1, 1))]}, TOPIC, TOKENS)
    assert caught.value.field == "tokens[0]"


@given(generation=st.integers(0, 14), receiver=st.integers(0, 14))
def test_a_token_names_its_key_generation_and_one_of_generation_0_keeps_version_3(
    generation, receiver
):
    """A lease of a later generation (a doubling's halves, or any slot once the topic doubled)
    names it; one of generation 0 is the previous version's token, byte for byte, which names
    none: read as the receiving process's generation, as that version's tokens are."""
    token = TOKENS.encode(LEASE, generation)
    version = base64.urlsafe_b64decode(token.split(".")[0] + "==").split(b":")[0]
    assert version == (b"4" if generation else b"3")
    assert TOKENS.decode(token, receiver) == TokenLease(LEASE, generation or receiver)


def test_a_tokens_generation_is_under_its_mac():
    mac = TOKENS.encode(LEASE, 1).split(".")[1]
    for other in (TOKENS.encode(LEASE, 2), TOKENS.encode(LEASE)):
        with pytest.raises(TokenRefusedError):
            TOKENS.decode(other.split(".")[0] + "." + mac, 0)


def test_a_half_may_name_twice_the_slots_and_an_older_generation_fewer():
    """A doubling's half (the next generation) is one of 2N slots; a lease of the generation
    before is one of N/2 (parsed: the routes answer it as fenced, never a 400)."""
    topic = Topic("orders", namespace="shop", slot_amount=8, slot_generation=2)
    for lease, generation in ((Lease(15, "a", 1, 1), 3), (Lease(3, "a", 1, 1), 1)):
        token = TOKENS.encode(lease, generation)
        assert parse_tokens({"tokens": [token]}, topic, TOKENS) == [TokenLease(lease, generation)]
    token = TOKENS.encode(Lease(7, "a", 1, 1))  # version 3: the receiver's generation
    assert parse_tokens({"tokens": [token]}, topic, TOKENS) == [TokenLease(Lease(7, "a", 1, 1), 2)]
    for lease, generation, shown in (
        (Lease(16, "a", 1, 1), 3, "0..15 of key generation 3"),
        (Lease(4, "a", 1, 1), 1, "0..3 of key generation 1"),
        (Lease(8, "a", 1, 1), 2, "0..7: forged"),
    ):
        with pytest.raises(FieldError, match=rf"outside {shown}"):
            parse_tokens({"tokens": [TOKENS.encode(lease, generation)]}, topic, TOKENS)
