"""Lease tokens: round trips, refusal of malformed, foreign and forged ones, the upgrade window."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.model import Lease
from delayq.queue.topic import Topic
from delayq.service.config import ServiceConfig
from delayq.service.parsing import FieldError, ForbiddenFieldError, parse_tokens
from delayq.service.tokens import LeaseTokens, TokenError, TokenRefusedError, derived_key

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_payload_bytes=16)
KEY = b"k" * 32
TOKENS = LeaseTokens(KEY, "shop", "orders")
LEASE = Lease(1, "a", 2, 3)


def unsigned(lease: Lease) -> str:
    """A token as the previous version (2) issued it: no MAC."""
    raw = f"2:{lease.slot}:{lease.epoch}:{lease.lease_id}:{lease.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@given(
    slot=st.integers(0, 16383),
    epoch=st.integers(0, 2**40),
    lease_id=st.integers(1, 2**40),
    message_id=st.text(min_size=1, max_size=64),
)
def test_tokens_round_trip(slot, epoch, lease_id, message_id):
    lease = Lease(slot, message_id, lease_id, epoch)
    token = TOKENS.encode(lease)
    assert token.isascii()
    assert TOKENS.decode(token) == lease


@pytest.mark.parametrize(
    "token", ["", "!!!", "bm90IGEgdG9rZW4", "bm90IGEgdG9rZW4.AAAA", TOKENS.encode(LEASE)[5:]]
)
def test_malformed_tokens_are_refused(token):
    with pytest.raises(TokenError) as raised:
        TOKENS.decode(token)
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
        TOKENS.decode(issuer.encode(LEASE))


def test_an_altered_token_is_refused():
    """Each field is under the MAC: a consumer cannot point its token at another lease."""
    fields, mac = TOKENS.encode(LEASE).split(".")
    others = (Lease(2, "a", 2, 3), Lease(1, "b", 2, 3), Lease(1, "a", 9, 3), Lease(1, "a", 2, 4))
    for other in others:
        altered = TOKENS.encode(other).split(".")[0] + "." + mac
        with pytest.raises(TokenRefusedError):
            TOKENS.decode(altered)
    flipped = mac[:-2] + ("AA" if mac[-2:] != "AA" else "BA")
    with pytest.raises(TokenRefusedError):
        TOKENS.decode(f"{fields}.{flipped}")
    with pytest.raises(TokenRefusedError):
        TOKENS.decode(f"{fields}.")  # version 3 without its MAC


def test_unsigned_tokens_are_accepted_for_one_lease_length_after_start():
    now = [100.0]
    tokens = LeaseTokens(KEY, "shop", "orders", accept_unsigned_ms=30_000, clock_s=lambda: now[0])
    assert tokens.decode(unsigned(LEASE)) == LEASE
    now[0] += 29.9
    assert tokens.decode(unsigned(LEASE)) == LEASE
    now[0] += 0.2
    with pytest.raises(TokenRefusedError, match=r"unsigned .* lease the message again"):
        tokens.decode(unsigned(LEASE))
    assert tokens.decode(tokens.encode(LEASE)) == LEASE  # signed ones stay good


def test_the_key_is_the_settings_or_derived_from_the_api_token():
    """Processes sharing a key (or, without one, an API token) accept each other's tokens."""
    config = ServiceConfig(namespace="shop", topic="orders", api_token="tok")
    token = config.lease_tokens().encode(LEASE)
    assert LeaseTokens(derived_key("tok"), "shop", "orders").decode(token) == LEASE
    with pytest.raises(TokenRefusedError):
        LeaseTokens(derived_key("other"), "shop", "orders").decode(token)
    keyed = ServiceConfig(namespace="shop", topic="orders", api_token="tok", lease_token_key="s")
    assert LeaseTokens(b"s", "shop", "orders").decode(keyed.lease_tokens().encode(LEASE)) == LEASE


def test_a_foreign_token_is_a_403_naming_the_field():
    foreign = LeaseTokens(KEY, "shop", "invoices").encode(LEASE)
    with pytest.raises(ForbiddenFieldError, match=r"tokens\[1\]: lease token .* not issued") as e:
        parse_tokens({"tokens": [TOKENS.encode(LEASE), foreign]}, TOPIC, TOKENS)
    assert (e.value.field, e.value.status) == ("tokens[1]", 403)


@pytest.mark.parametrize("slot", [-1, 4, 10**6])
def test_token_slots_outside_the_topic_are_400(slot):
    """Signed tokens name the slots of their topic; unsigned ones of the upgrade window are
    checked too."""
    for tokens, token in (
        (TOKENS, TOKENS.encode(Lease(slot, "a", 1, 1))),
        (LeaseTokens(KEY, "shop", "orders", 60_000), unsigned(Lease(slot, "a", 1, 1))),
    ):
        with pytest.raises(FieldError, match=r"outside 0\.\.3") as caught:
            parse_tokens({"tokens": [token]}, TOPIC, tokens)
        assert caught.value.field == "tokens[0]"
