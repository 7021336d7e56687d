"""Handler outcomes that carry a status patch: the wrapper writes it, then tells kopf how to retry.

A permanent failure (the spec can never work) becomes kopf.PermanentError: no retry loop, the
user sees Ready=False with the reason until the spec changes. A transient one (API server or
ZooKeeper unreachable, conflicts) becomes kopf.TemporaryError with a backoff delay.
"""

from __future__ import annotations

from typing import Any


class TopicFailure(Exception):
    """Reconciliation stopped; `status` is the patch to write before retrying or giving up."""

    def __init__(
        self, message: str, status: dict[str, Any], permanent: bool, delay_s: float = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.permanent = permanent
        self.delay_s = delay_s
