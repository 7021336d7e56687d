"""Standard Webhooks signatures of webhook deliveries, and the extra headers sent with them (pure).

Standard Webhooks (standardwebhooks.com) is the scheme receivers already have libraries for in
most languages: `webhook-id` (the message id), `webhook-timestamp` (unix seconds) and
`webhook-signature`, a space-separated list of `v1,<base64 HMAC-SHA256(key, "<id>.<ts>.<body>")>`,
one per active secret, so a receiver holding either the current or the previous secret accepts
the delivery while a rotation is under way. The timestamp is signed with the body so a receiver
can refuse replays (the libraries' tolerance is five minutes).

The HMAC is the `standardwebhooks` package's (the reference implementation, no dependencies),
so what delayq sends is what the receivers' libraries check by construction. The secret format
is checked here, strictly: the package decodes leniently and would sign with garbage bytes.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime

from standardwebhooks import Webhook

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
#: The spec's bounds on a secret's key bytes: shorter is guessable, longer buys nothing.
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
#: An HTTP header name (RFC 9110 token).
HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
#: Headers delayq writes itself (or the HTTP client does): an extra header must not replace them.
RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "host", "transfer-encoding", "connection"}
)
RESERVED_PREFIXES = ("webhook-", "x-delayq-")


class Signer:
    """Signs with every active secret: `secrets` holds one or more `whsec_<base64>` values
    separated by whitespace (the current one, and during a rotation the previous one)."""

    def __init__(self, secrets: str) -> None:
        self._keys = tuple(Webhook(parse_secret(secret)) for secret in secrets.split())

    def __bool__(self) -> bool:
        return bool(self._keys)

    def headers(self, message_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers of `body` sent as `message_id` at `timestamp_s`
        (empty without a secret: the delivery goes unsigned)."""
        if not self._keys:
            return {}
        at = datetime.fromtimestamp(timestamp_s, tz=UTC)
        data = body.decode()  # the body is JSON, hence UTF-8; signed byte for byte
        return {
            ID_HEADER: message_id,
            TIMESTAMP_HEADER: str(timestamp_s),
            SIGNATURE_HEADER: " ".join(key.sign(message_id, at, data) for key in self._keys),
        }


def parse_secret(secret: str) -> bytes:
    """The key bytes of one `whsec_<base64>` secret; ValueError saying what is wrong."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(
            f"a signing secret must be {SECRET_PREFIX} followed by base64 "
            f"(make one with: echo {SECRET_PREFIX}$(head -c 32 /dev/urandom | base64))"
        )
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValueError(f"a signing secret after {SECRET_PREFIX} must be base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"a signing secret must hold {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes, "
            f"got {len(key)}"
        )
    return key


def parse_extra_headers(text: str) -> dict[str, str]:
    """`Name: value` lines (blank lines skipped) as headers sent with every delivery, e.g. the
    receiver's own `Authorization`; ValueError naming the bad line. A header delayq sets itself
    (Content-Type, webhook-*, X-Delayq-*) is refused, so a receiver can trust those."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not HEADER_NAME.match(name):
            raise ValueError(
                f"line {number} must be `Name: value` with a header name, got {name!r}"
            )
        lowered = name.lower()
        if lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIXES):
            raise ValueError(f"line {number}: {name} is set by delayq and cannot be replaced")
        if any((ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F for char in value):
            raise ValueError(f"line {number}: the value of {name} has a control character")
        headers[name] = value
    return headers
