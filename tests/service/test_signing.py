"""Webhook signatures (Standard Webhooks): the spec's vector, what the receivers' library
accepts and refuses, rotation with two secrets, secret formats and extra headers."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from delayq.service.delivery.signing import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Signer,
    parse_extra_headers,
    parse_secret,
)

# The example of the Standard Webhooks specification and of its libraries' tests.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP_S = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

CURRENT = "whsec_" + base64.b64encode(b"c" * 32).decode()
PREVIOUS = "whsec_" + base64.b64encode(b"p" * 32).decode()
STRANGER = "whsec_" + base64.b64encode(b"s" * 32).decode()


def test_the_specification_vector():
    headers = Signer(SPEC_SECRET).headers(SPEC_ID, SPEC_TIMESTAMP_S, SPEC_BODY)
    assert headers == {
        ID_HEADER: SPEC_ID,
        TIMESTAMP_HEADER: str(SPEC_TIMESTAMP_S),
        SIGNATURE_HEADER: SPEC_SIGNATURE,
    }


def test_the_receivers_library_accepts_and_refuses():
    body = b'{"id":"a","payload":"hello"}'
    now_s = int(time.time())
    headers = Signer(CURRENT).headers("a", now_s, body)
    assert Webhook(CURRENT).verify(body, headers) == {"id": "a", "payload": "hello"}
    refused = [
        (STRANGER, body, headers),
        (CURRENT, body + b" ", headers),
        (CURRENT, body, {**headers, ID_HEADER: "b"}),
        (CURRENT, body, {**headers, TIMESTAMP_HEADER: str(now_s + 1)}),
        (CURRENT, body, Signer(CURRENT).headers("a", now_s - 10 * 60, body)),  # a replay
    ]
    for secret, sent, sent_headers in refused:
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(sent, sent_headers)


def test_rotation_signs_with_both_secrets_so_either_receiver_verifies():
    body = b'{"id":"r"}'
    headers = Signer(f"{CURRENT}  {PREVIOUS}\n").headers("r", int(time.time()), body)
    signatures = headers[SIGNATURE_HEADER].split(" ")
    assert len(signatures) == 2
    assert all(s.startswith("v1,") for s in signatures)
    for secret in (CURRENT, PREVIOUS):
        Webhook(secret).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(STRANGER).verify(body, headers)


def test_no_secret_signs_nothing():
    signer = Signer("")
    assert not signer
    assert signer.headers("a", 1, b"{}") == {}


def test_an_unpadded_secret_is_read_like_the_libraries_do():
    unpadded = "whsec_" + base64.b64encode(b"u" * 25).decode().rstrip("=")
    assert parse_secret(unpadded) == b"u" * 25


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("s3cret", "must be whsec_ followed by base64"),
        ("WHSEC_" + base64.b64encode(b"x" * 32).decode(), "must be whsec_ followed by base64"),
        ("whsec_not-base64!", "after whsec_ must be base64"),
        ("whsec_***", "after whsec_ must be base64"),
        ("whsec_" + base64.b64encode(b"x" * 16).decode(), "24 to 64 random bytes, got 16"),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), "24 to 64 random bytes, got 65"),
    ],
)
def test_a_bad_secret_is_refused_with_the_reason(secret: str, message: str):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        Signer(secret)


def test_extra_headers_are_name_value_lines():
    text = "Authorization: Bearer abc:def\n\n  X-Tenant :  shop\t\n"
    assert parse_extra_headers(text) == {"Authorization": "Bearer abc:def", "X-Tenant": "shop"}
    assert parse_extra_headers("") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Authorization Bearer abc", "line 1 must be `Name: value`"),
        ("X-Ok: 1\nBad Name: 2", "line 2 must be `Name: value`"),
        ("Content-Type: text/plain", "Content-Type is set by delayq"),
        ("webhook-signature: v1,forged", "webhook-signature is set by delayq"),
        ("X-Delayq-Attempt: 1", "X-Delayq-Attempt is set by delayq"),
        ("X-Bell: a\x07b", "the value of X-Bell has a control character"),
    ],
)
def test_bad_extra_headers_are_refused_with_the_line(text: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_extra_headers(text)
