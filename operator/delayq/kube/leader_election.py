"""Leader election: the I/O around the pure decisions of leader_lease.py, over a KubeClient.

Every replica campaigns (`acquire`); the winner leads while `hold` keeps renewing, and `hold`
raises LeadershipLost as soon as the renew deadline passes without a successful renewal or
another candidate holds the Lease: the caller then stops kopf and the process exits non-zero, so
a replica that may have been replaced never acts again (its pod restarts as a fresh candidate).
A clean shutdown `release`s the Lease so that a standby takes over at once, not after expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from delayq.kube.builders.common import Manifest
from delayq.kube.client import KubeApiError, KubeClient
from delayq.kube.leader_lease import (
    LEADER_LEASE_API_VERSION,
    LEADER_LEASE_KIND,
    Action,
    LeaderLeaseRecord,
    LeaderLeaseTiming,
    Observation,
    decide,
    new_leader_lease,
    observe,
    release_patch,
    still_leading,
    write_patch,
)

logger = logging.getLogger(__name__)
# What a failed round may raise; the next round (or the deadline) decides what it means.
ROUND_ERRORS = (KubeApiError, aiohttp.ClientError, TimeoutError, OSError)
RELEASE_TIMEOUT_S = 5.0


class LeadershipLost(Exception):
    """This replica may no longer act as the leader (the process must stop acting at once)."""


def make_identity(env: Mapping[str, str] | None = None) -> str:
    """The pod name (downward API) plus a random suffix: a restarted pod is a new candidate."""
    env = os.environ if env is None else env
    return f"{env.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    """One candidate's view of the Lease `namespace/name`."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaderLeaseTiming,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = utc_now,
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity, self.timing = identity, timing
        self.clock, self.wall = clock, wall
        self.observation: Observation | None = None
        self.renewed_at_s = float("-inf")  # when the last successful write was *sent*

    async def read(self) -> Manifest | None:
        """The Lease as stored, or None when it does not exist."""
        return await self.kube.get(
            LEADER_LEASE_API_VERSION, LEADER_LEASE_KIND, self.namespace, self.name
        )

    async def write(self, patch: Mapping[str, Any]) -> Manifest:
        """Merge-patch the Lease; fenced when the patch carries a resourceVersion."""
        return await self.kube.patch(
            LEADER_LEASE_API_VERSION, LEADER_LEASE_KIND, self.namespace, self.name, patch
        )

    async def attempt(self) -> bool:
        """One round: read the Lease, decide, write if due. True when we hold it afterwards."""
        sent_s = self.clock()
        found = await self.read()
        now_s = self.clock()
        self.observation = (
            None
            if found is None
            else observe(self.observation, LeaderLeaseRecord.from_object(found), now_s)
        )
        action = decide(self.observation, self.identity, now_s)
        if action is Action.WAIT:
            return False
        try:
            if self.observation is None:
                manifest = new_leader_lease(
                    self.namespace, self.name, self.identity, self.timing, self.wall()
                )
                written = await self.kube.create(manifest)
            else:
                patch = write_patch(
                    action, self.observation.record, self.identity, self.timing, self.wall()
                )
                written = await self.write(patch)
        except KubeApiError as error:
            if error.status in (404, 409):
                return False  # someone else wrote first (or deleted it): read again next round
            raise
        self.observation = Observation(LeaderLeaseRecord.from_object(written), self.clock())
        self.renewed_at_s = sent_s
        if action is Action.ACQUIRE:
            logger.info("acquired the lease %s/%s as %s", self.namespace, self.name, self.identity)
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Campaign until this candidate holds the Lease (True) or `stop` is set (False)."""
        logger.info(
            "campaigning for the lease %s/%s as %s", self.namespace, self.name, self.identity
        )
        while not stop.is_set():
            try:
                if await asyncio.wait_for(self.attempt(), self.timing.lease_duration_s):
                    return True
            except ROUND_ERRORS as error:
                logger.warning("lease %s/%s unavailable: %r", self.namespace, self.name, error)
            await wait_or_stop(stop, self.timing.retry_interval_s)
        return False

    async def hold(self) -> None:
        """Renew every renew interval (retrying failures); raise LeadershipLost when it ends."""
        renewed = True
        while True:
            now_s = self.clock()
            deadline_s = self.renewed_at_s + self.timing.renew_deadline_s
            due_s = (
                self.renewed_at_s + self.timing.renew_interval_s
                if renewed
                else now_s + self.timing.retry_interval_s
            )
            await asyncio.sleep(max(0.0, min(due_s, deadline_s) - now_s))
            now_s = self.clock()
            if not still_leading(self.renewed_at_s, now_s, self.timing):
                raise LeadershipLost(
                    f"no renewal of the lease {self.namespace}/{self.name} within "
                    f"{self.timing.renew_deadline_s:g} s"
                )
            try:
                renewed = await asyncio.wait_for(self.attempt(), deadline_s - now_s)
            except ROUND_ERRORS as error:
                logger.warning("could not renew the lease: %r", error)
                renewed = False
                continue
            holder = self.observation.record.holder if self.observation else ""
            if not renewed and holder and holder != self.identity:
                raise LeadershipLost(f"{holder} holds the lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Clear the holder if it is still us (fenced; best effort: failures are logged)."""
        try:
            found = await asyncio.wait_for(self.read(), RELEASE_TIMEOUT_S)
            if found is None:
                return
            record = LeaderLeaseRecord.from_object(found)
            if record.holder != self.identity:
                return
            await asyncio.wait_for(
                self.write(release_patch(record, self.wall())), RELEASE_TIMEOUT_S
            )
            logger.info("released the lease %s/%s", self.namespace, self.name)
        except ROUND_ERRORS as error:
            logger.warning("could not release the lease (it expires by itself): %r", error)


async def wait_or_stop(stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less when `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout_s)
