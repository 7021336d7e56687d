"""Lease tokens for pull consumers: opaque, bound to their topic and authenticated (pure).

A token carries everything an ack, nack or extend needs — slot, fencing epoch, lease number and
id — so the service keeps no per-lease state: any process of the topic can accept it, and a
token from before a failover is refused by the fencing epoch (409), never silently applied.

Each token ends in an HMAC-SHA256 (truncated to 128 bits) over the topic (`<namespace>/<name>`)
and those fields, keyed with the topic's lease-token key that all its processes share
(`lease_token_key`; on Kubernetes the generated `lease-token-key` of the topic's Secret; for a
hand-run `serve` without one, derived from `api_token`). So a token is honoured only by the
topic that issued it: another topic's token, or one whose slot, epoch, lease number or id was
changed, is refused (`TokenRefusedError`, HTTP 403) before Redis is touched, with a
constant-time comparison. Format: `base64url(3:slot:epoch:lease:id) "." base64url(mac)`.

Rolling upgrade: version-2 tokens had no MAC. A process accepts them for one lease length
(the topic's `ack_timeout_ms`) after it starts, so leases handed out by a process of the
previous version can still be acked; later they are refused like forged ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable

from delayq.queue.model import Lease

_VERSION = "3"  # 3: signed (2: the lease number replaced the attempt, unsigned)
_UNSIGNED_VERSION = "2"
_MAC_BYTES = 16
#: What a key derived from the API token is derived with (a hand-run `serve` without a key).
_DERIVATION_LABEL = b"delayq lease-token key v1"


class TokenError(ValueError):
    """The token is not a lease token (HTTP 400)."""


class TokenRefusedError(TokenError):
    """A well-formed token this topic did not issue: another topic's, altered, or unsigned
    after the upgrade window (HTTP 403)."""


def derived_key(api_token: str) -> bytes:
    """The lease-token key of a process given none: a function of the API token, which every
    process of a hand-run topic shares (without one the API is open, and the MAC still binds
    tokens to their topic)."""
    return hmac.digest(api_token.encode(), _DERIVATION_LABEL, hashlib.sha256)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class LeaseTokens:
    """Issues and checks one topic's lease tokens."""

    def __init__(
        self,
        key: bytes,
        namespace: str,
        topic: str,
        accept_unsigned_ms: int = 0,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scope = f"{namespace}/{topic}"
        # the HMAC's state after the key and the topic, copied per token: half the work of a
        # one-shot HMAC, which matters at a thousand tokens a request (leased, then acked)
        self._keyed = hmac.new(key, self._scope.encode() + b"\n", hashlib.sha256)
        self._unsigned_until_s = clock_s() + accept_unsigned_ms / 1000
        self._clock_s = clock_s

    def encode(self, lease: Lease) -> str:
        fields = f"{_VERSION}:{lease.slot}:{lease.epoch}:{lease.lease_id}:{lease.id}".encode()
        return f"{_b64(fields)}.{_b64(self._mac(fields))}"

    def decode(self, token: str) -> Lease:
        """The lease a token names; TokenError if it is none, TokenRefusedError if this topic
        did not issue it."""
        shown = repr(token[:40])
        try:
            encoded_fields, dot, encoded_mac = token.partition(".")
            fields = _unb64(encoded_fields)
            mac = _unb64(encoded_mac) if dot else b""
            version, slot, epoch, lease_id, message_id = fields.decode().split(":", 4)
            if not message_id:
                raise ValueError("empty id")
            lease = Lease(int(slot), message_id, int(lease_id), int(epoch))
        except (binascii.Error, UnicodeDecodeError, ValueError) as error:
            raise TokenError(f"malformed lease token {shown}") from error
        if version == _VERSION and dot:
            if not hmac.compare_digest(mac, self._mac(fields)):
                raise TokenRefusedError(
                    f"lease token {shown} was not issued by topic {self._scope} "
                    "(another topic's, or altered)"
                )
            return lease
        if version == _UNSIGNED_VERSION and not dot:
            if self._clock_s() < self._unsigned_until_s:
                return lease
            raise TokenRefusedError(
                f"lease token {shown} is unsigned (from a version before lease tokens were "
                "signed) and its lease has run out: lease the message again"
            )
        raise TokenError(f"malformed lease token {shown}: unknown version")

    def _mac(self, fields: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(fields)
        return mac.digest()[:_MAC_BYTES]
