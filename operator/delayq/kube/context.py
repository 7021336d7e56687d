"""The operator's one context object: settings, clients and the little state kept between passes.

Every replica builds one OperatorContext; the change handlers, the health loop and the leader's
run all receive it, so tests swap any part of it (the Kubernetes login, the ZooKeeper store, the
Redis control, the clocks). The API client and the per-topic state exist only while the replica
leads: `start_leading` opens a term with fresh state, `stop_leading` ends it and hands back the
client to close; `kube` outside a term raises kopf.TemporaryError (kopf retries shortly).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from delayq.kube.builders.common import BuildContext
from delayq.kube.client import KubeClient
from delayq.kube.config import OperatorConfig
from delayq.kube.leader_election import make_identity
from delayq.kube.metrics import OperatorMetrics
from delayq.kube.objective_scrape import MetricsScraper
from delayq.kube.objectives import LatenessWindow
from delayq.kube.pairing import PAIRING_WAIT_S
from delayq.kube.recorder import EventRecorder
from delayq.kube.redisctl import RedisCommands, RedisControl
from delayq.kube.zk import KazooTopicStore, TopicStore

# kopf hands handlers either a Logger or a LoggerAdapter (with the object in context).
Logger = logging.Logger | logging.LoggerAdapter[Any]
Login = Callable[[], kopf.ConnectionInfo]


def default_login() -> kopf.ConnectionInfo:
    """In-cluster service account first, then a kubeconfig (for running outside the cluster)."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("no service account and no kubeconfig: cannot reach Kubernetes")
    return info


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class OperatorContext:
    """What the handlers, the health loop and the leader's run share; one per operator process."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    login: Login = default_login
    # the ensembles it may connect to are the platform's: no default (see from_config)
    store: TopicStore = field(kw_only=True)
    redis: RedisControl = field(default_factory=RedisCommands)
    scraper: MetricsScraper = field(default_factory=MetricsScraper)  # the service pods' /metrics
    identity: str = field(default_factory=make_identity)  # this replica's name in the Lease
    clock: Callable[[], float] = time.time
    generate: Callable[[], str] = generate_secret
    # How long one reconcile waits for service pods to be placed before it creates the Redis
    # StatefulSets that pair with them (kube/pairing.py); kmock tests, which have no
    # scheduler, pass 0
    pairing_wait_s: float = PAIRING_WAIT_S
    # The leader's API client: set for a term by start_leading (tests pass one directly).
    client: KubeClient | None = None
    # (namespace, topic, broker) -> when its master was first seen missing (grace period start)
    master_missing_since: dict[tuple[str, str, int], float] = field(default_factory=dict)
    # (namespace, topic) -> since when its roll has waited for updated replicas to sync
    roll_waiting_since: dict[tuple[str, str], float] = field(default_factory=dict)
    # (namespace, topic, broker) -> the master pod its roll restarted in place, until it is back
    rolled_in_place: dict[tuple[str, str, int], str] = field(default_factory=dict)
    # (namespace, topic) -> since when some slot of it has had no owner (SlotsUnowned)
    unowned_since: dict[tuple[str, str], float] = field(default_factory=dict)
    # (namespace, topic, broker, library) -> since when that functions library has been
    # unused on that broker's master (kube/libraries.py: deleted after a grace)
    library_unused_since: dict[tuple[str, str, int, str], float] = field(default_factory=dict)
    # (namespace, topic) -> its service pods' lateness readings of the objective's window
    lateness_windows: dict[tuple[str, str], LatenessWindow] = field(default_factory=dict)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    # Posts the topics' Events; what it posted recently is forgotten with the term.
    recorder: EventRecorder = field(init=False)
    # The process's Prometheus metrics (served by every replica, see metrics_server.py).
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)

    def __post_init__(self) -> None:
        self.recorder = EventRecorder(self.identity, self.clock)

    @classmethod
    def from_config(cls, config: OperatorConfig, **parts: Any) -> OperatorContext:
        """The context of a real operator: its ZooKeeper store logs in with the configured
        admin password (unless `parts` brings a store); other `parts` replace defaults."""
        parts.setdefault(
            "store",
            KazooTopicStore(
                config.build.zookeeper_ensembles,
                admin_password=config.zookeeper_admin_password,
                tls=config.zookeeper_tls,
            ),
        )
        return cls(config, **parts)

    @property
    def kube(self) -> KubeClient:
        if self.client is None:
            raise kopf.TemporaryError("operator is still starting", delay=1)
        return self.client

    @property
    def build(self) -> BuildContext:
        return self.config.build

    @property
    def failover_grace_s(self) -> float:
        return self.config.failover_grace_s

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """One lock per topic: its handlers and health passes never compute status concurrently."""
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    def start_leading(self) -> None:
        """Open a term: a new API client, and no grace timer or lock left from an earlier one."""
        self.client = KubeClient(self.login())
        self.master_missing_since = {}
        self.roll_waiting_since = {}
        self.rolled_in_place = {}
        self.unowned_since = {}
        self.library_unused_since = {}
        self.lateness_windows = {}
        self.locks = {}
        self.recorder = EventRecorder(self.identity, self.clock)
        self.metrics.is_leader.set(1)

    def stop_leading(self) -> KubeClient | None:
        """End the term; returns the API client for the caller to close."""
        client, self.client = self.client, None
        self.metrics.is_leader.set(0)
        self.metrics.keep_topics(())  # a standby exports no topic figures
        return client
