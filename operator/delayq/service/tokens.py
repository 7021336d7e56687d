"""Lease tokens for pull consumers: opaque, bound to their topic and authenticated (pure).

A token carries everything an ack, nack or extend needs — slot, fencing epoch, lease number and
id, and the slot's key generation once the topic's slots doubled — so the service keeps no
per-lease state: any process of the topic can accept it, and a token from before a failover is
refused by the fencing epoch (409), never silently applied.

Each token ends in an HMAC-SHA256 (truncated to 128 bits) over the topic (`<namespace>/<name>`)
and those fields, keyed with the topic's lease-token key that all its processes share
(`lease_token_key`; on Kubernetes the generated `lease-token-key` of the topic's Secret; for a
hand-run `serve` without one, derived from `api_token`). So a token is honoured only by the
topic that issued it: another topic's token, or one whose slot, epoch, lease number or id was
changed, is refused (`TokenRefusedError`, HTTP 403) before Redis is touched, with a
constant-time comparison. Format: `base64url(3:slot:epoch:lease:id) "." base64url(mac)` for a
slot of key generation 0 (a topic that never doubled: the tokens of the previous version), and
`base64url(4:generation:slot:epoch:lease:id) "." base64url(mac)` for a later one, so a lease of a
doubling's halves (the next generation, leased while the doubling switches slots) names the keys
it is acked in. A token without a generation (version 3) is read as the receiving process's
generation, as the version before version 4 issued it: one of generation 0 that reaches a
process of a later generation names the half of its slot number, whose owner fenced above it.

Unsigned tokens are refused (403), whatever their version: 0.1.0, the only release before
signed tokens, issued version-1 tokens (an attempt where the lease number is now, never
acceptable), and version 2 (unsigned, with the lease number) was never released. Accepting
version 2 for a lease length after each process start, as this once did, served no upgrade and
let a holder of the topic's API token forge acks and nacks of leases handed to others after
every pod restart. A process of the previous release refuses a version-3 or -4 token (400,
unknown version) and a process of this one refuses the previous release's: during a rolling
upgrade such a lease's message comes back when its lease runs out (at least once holds).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import NamedTuple

from delayq.queue.model import Lease, Leased

_VERSION = "3"  # 3: signed (1, 0.1.0: unsigned, an attempt; 2, never released: unsigned)
_GENERATION_VERSION = "4"  # 4: version 3 with the slot's key generation (1 and later)
_UNSIGNED_VERSIONS = ("1", "2")  # refused as unsigned (403), not unknown (400)
_MAC_BYTES = 16
#: What a key derived from the API token is derived with (a hand-run `serve` without a key).
_DERIVATION_LABEL = b"delayq lease-token key v1"


class TokenLease(NamedTuple):
    """What a token names: a lease of a slot of key generation `generation`."""

    lease: Lease
    generation: int


class TokenError(ValueError):
    """The token is not a lease token (HTTP 400)."""


class TokenRefusedError(TokenError):
    """A well-formed token this topic did not issue: another topic's, altered, or unsigned
    (HTTP 403)."""


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

    def __init__(self, key: bytes, namespace: str, topic: str) -> None:
        self._scope = f"{namespace}/{topic}"
        # the HMAC's state after the key and the topic, copied per token: half the work of a
        # one-shot HMAC, which matters at a thousand tokens a request (leased, then acked)
        self._keyed = hmac.new(key, self._scope.encode() + b"\n", hashlib.sha256)

    def encode(self, lease: Leased, generation: int = 0) -> str:
        """The token of `lease`, a lease of a slot of key generation `generation`."""
        named = f"{lease.slot}:{lease.epoch}:{lease.lease_id}:{lease.id}"
        if generation:
            fields = f"{_GENERATION_VERSION}:{generation}:{named}".encode()
        else:
            fields = f"{_VERSION}:{named}".encode()
        return f"{_b64(fields)}.{_b64(self._mac(fields))}"

    def decode(self, token: str, generation: int) -> TokenLease:
        """The lease a token names, and its slot's key generation (one the token does not
        name, of a version-3 token: `generation`, the receiving process's own);
        TokenError if it is none, TokenRefusedError if this topic did not issue it."""
        shown = repr(token[:40])
        try:
            encoded_fields, dot, encoded_mac = token.partition(".")
            fields = _unb64(encoded_fields)
            mac = _unb64(encoded_mac) if dot else b""
            version, named = fields.decode().split(":", 1)
            if version == _GENERATION_VERSION:
                named_generation, named = named.split(":", 1)
                generation = int(named_generation)
            slot, epoch, lease_id, message_id = named.split(":", 3)
            if not message_id:
                raise ValueError("empty id")
            lease = TokenLease(Lease(int(slot), message_id, int(lease_id), int(epoch)), generation)
        except (binascii.Error, UnicodeDecodeError, ValueError) as error:
            raise TokenError(f"malformed lease token {shown}") from error
        if version not in (_VERSION, _GENERATION_VERSION, *_UNSIGNED_VERSIONS):
            raise TokenError(f"malformed lease token {shown}: unknown version")
        if version in _UNSIGNED_VERSIONS or not mac:
            raise TokenRefusedError(
                f"lease token {shown} is unsigned (from a version before lease tokens were "
                "signed), so this topic did not issue it: lease the message again"
            )
        if not hmac.compare_digest(mac, self._mac(fields)):
            raise TokenRefusedError(
                f"lease token {shown} was not issued by topic {self._scope} "
                "(another topic's, or altered)"
            )
        return lease

    def _mac(self, fields: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(fields)
        return mac.digest()[:_MAC_BYTES]
