"""HMAC-SHA256 signatures of webhook bodies, and the check receivers run (pure).

Header: `X-Delayq-Signature: t=<unix ms>,v1=<hex>` where hex = HMAC-SHA256(secret, "<t>." + body).
Signing the timestamp with the body lets a receiver refuse replays older than a tolerance.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Delayq-Signature"
DEFAULT_TOLERANCE_MS = 5 * 60 * 1000


def sign(secret: str, body: bytes, timestamp_ms: int) -> str:
    """The header value for `body` signed at `timestamp_ms`."""
    return f"t={timestamp_ms},v1={_digest(secret, body, timestamp_ms)}"


def verify(
    secret: str,
    header: str,
    body: bytes,
    now_ms: int,
    tolerance_ms: int = DEFAULT_TOLERANCE_MS,
) -> bool:
    """True when `header` is a valid signature of `body` no older than `tolerance_ms`."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp_ms = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now_ms - timestamp_ms) > tolerance_ms:
        return False
    expected = _digest(secret, body, timestamp_ms)
    return hmac.compare_digest(expected, fields.get("v1", ""))


def _digest(secret: str, body: bytes, timestamp_ms: int) -> str:
    signed = str(timestamp_ms).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
