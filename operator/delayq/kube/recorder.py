"""Posting a topic's Events: core/v1 Events through the operator's own API client, best effort.

Why not kopf.event / kopf.info: they only work inside kopf's handler tasks (they read kopf's
context variables, which the leader's health loop, where failovers happen, does not have), and
kopf.info is dropped below kopf's posting level. Why core/v1 rather than events.k8s.io/v1: it is
what kopf posts and `kubectl describe` lists, and the operator's RBAC already allows `create` on
it. The same client also makes the Events visible to the tests' in-memory API.

Deduplication has two layers: events.py only yields transitions of the stored status, and this
recorder drops an Event whose (topic, reason, message) it posted less than `repeat_after_s` ago,
so a condition that flaps every pass does not flood the namespace. Posting never fails the
caller: an Event is information, and a failed post is logged.
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from delayq.kube.client import KubeApiError, KubeClient
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.events import TopicEvent, event_manifest

REPEAT_AFTER_S = 600.0
LOGGER = logging.getLogger(__name__)
EventKey = tuple[str, str, str, str]  # (namespace, topic, reason, message)


def event_name(topic: str, now_s: float) -> str:
    """Unique per Event, ordered by time: client-go's `<object>.<nanoseconds hex>` plus 48 bits
    of noise, so Events posted at one instant (a clock that did not move, as in the tests) do
    not collide: with 16 bits, two of a resharding's Events once got one name and the API
    refused the second (409)."""
    return f"{topic}.{int(now_s * 1e9):x}{secrets.token_hex(6)}"


def iso(now_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(now_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Posts TopicEvents on a DelayTopic; remembers what it posted for `repeat_after_s`."""

    def __init__(
        self,
        instance: str,
        clock: Callable[[], float],
        repeat_after_s: float = REPEAT_AFTER_S,
    ) -> None:
        self.instance, self.clock, self.repeat_after_s = instance, clock, repeat_after_s
        self.posted_at: dict[EventKey, float] = {}

    async def post(
        self, kube: KubeClient, topic: Mapping[str, Any], events: Sequence[TopicEvent]
    ) -> int:
        """Post the events not posted recently; returns how many were posted."""
        meta = topic["metadata"]
        now_s = self.clock()
        self.posted_at = {
            key: at for key, at in self.posted_at.items() if now_s - at < self.repeat_after_s
        }
        posted = 0
        for event in events:
            key = (meta["namespace"], meta["name"], event.reason, event.message)
            if key in self.posted_at:
                continue
            manifest = event_manifest(
                topic, event, iso(now_s), event_name(meta["name"], now_s), self.instance
            )
            try:
                await kube.create(manifest)
            except (KubeApiError, *TRANSIENT_ERRORS) as error:
                LOGGER.warning("cannot post Event %s on %s: %r", event.reason, meta["name"], error)
                continue
            self.posted_at[key] = now_s
            posted += 1
        return posted
