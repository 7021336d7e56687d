"""What the handlers need from the outside world, injected so tests can swap each part."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayq.kube.builders.common import BuildContext
from delayq.kube.client import KubeClient
from delayq.kube.redisctl import RedisControl
from delayq.kube.zk import TopicStore

# kopf hands handlers either a Logger or a LoggerAdapter (with the object in context).
Logger = logging.Logger | logging.LoggerAdapter[Any]


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Deps:
    """Clients, settings and the little state the operator keeps between timer ticks."""

    kube: KubeClient
    store: TopicStore
    redis: RedisControl
    ctx: BuildContext = field(default_factory=BuildContext)
    failover_grace_s: float = 30.0
    clock: Callable[[], float] = time.time
    generate: Callable[[], str] = generate_secret
    # (namespace, topic, broker) -> when its master was first seen missing (grace period start)
    master_missing_since: dict[tuple[str, str, int], float] = field(default_factory=dict)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """One lock per topic: its handlers and timer never compute status concurrently."""
        return self.locks.setdefault((namespace, name), asyncio.Lock())
