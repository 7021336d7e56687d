"""Failures the operator tells apart: handler outcomes carrying a status patch, transient errors.

TopicFailure is a handler outcome that carries a status patch: the wrapper (operator.serialized)
writes it, then tells kopf how to retry.

A permanent failure (the spec can never work) becomes kopf.PermanentError: no retry loop, the
user sees Ready=False with the reason until the spec changes. A transient one (API server or
ZooKeeper unreachable, conflicts) becomes kopf.TemporaryError with a backoff delay.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from kazoo.exceptions import KazooException

# What the API server, ZooKeeper or the network raise when they are briefly unavailable.
TRANSIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, KazooException, OSError)


class TopicFailure(Exception):
    """Reconciliation stopped; `status` is the patch to write before retrying or giving up."""

    def __init__(
        self, message: str, status: dict[str, Any], permanent: bool, delay_s: float = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.permanent = permanent
        self.delay_s = delay_s
