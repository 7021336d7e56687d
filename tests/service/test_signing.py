"""Webhook signatures: verification and tamper detection."""

from __future__ import annotations

from delayq.service.delivery.signing import sign, verify


def test_signature_verifies_and_detects_tampering():
    body = b'{"id":"a"}'
    header = sign("s3cret", body, 1_000_000)
    assert header.startswith("t=1000000,v1=")
    assert verify("s3cret", header, body, now_ms=1_000_500)
    assert not verify("s3cret", header, body + b" ", now_ms=1_000_500)
    assert not verify("other", header, body, now_ms=1_000_500)
    assert not verify("s3cret", header, body, now_ms=1_000_000 + 10 * 60 * 1000)  # replayed
    assert not verify("s3cret", "garbage", body, now_ms=1_000_000)
