"""Opaque lease tokens for pull consumers (pure).

A token carries everything an ack, nack or extend needs — slot, fencing epoch, lease number and
id —
so the service keeps no per-lease state: any process can accept it, and a token from before a
failover is refused by the fencing epoch (409), never silently applied.
"""

from __future__ import annotations

import base64
import binascii

from delayq.queue.model import Lease

_VERSION = "2"  # 2: the lease number (a per-slot counter) replaced the attempt


class TokenError(ValueError):
    """The token was not issued by a delay service (or was altered)."""


def encode_token(lease: Lease) -> str:
    raw = f"{_VERSION}:{lease.slot}:{lease.epoch}:{lease.lease_id}:{lease.id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_token(token: str) -> Lease:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        version, slot, epoch, lease_id, message_id = raw.split(":", 4)
        if version != _VERSION or not message_id:
            raise TokenError("unknown token version or empty id")
        return Lease(int(slot), message_id, int(lease_id), int(epoch))
    except (binascii.Error, UnicodeDecodeError, ValueError) as error:
        raise TokenError(f"malformed lease token {token[:40]!r}") from error
