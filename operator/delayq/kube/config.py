"""Operator settings from the environment (the chart sets these) and CLI flags (which win)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from delayq.coordination.acl import ADMIN_USER, ZkIdentity
from delayq.coordination.tls import ZkTls
from delayq.kube.builders.common import BuildContext, PodPlacement, ServiceMonitorSettings
from delayq.kube.ensembles import ALLOWED_ENSEMBLES_ENV, check_ensembles
from delayq.kube.leader_lease import LeaderLeaseTiming
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.tenant_policy import TenantPolicy
from delayq.kube.zookeeper_clients import POLICY_ENV as CLIENTS_POLICY_ENV


@dataclass(frozen=True)
class OperatorConfig:
    """How one `delayq operator` process runs."""

    namespaces: tuple[str, ...] = ()  # empty: watch every namespace (cluster-wide)
    leader_lease_name: str = "delayq-operator"  # in the operator's namespace (POD_NAMESPACE)
    standalone: bool = False  # no leader election: only when exactly one operator ever runs
    leader_lease: LeaderLeaseTiming = field(default_factory=LeaderLeaseTiming)
    health_interval_s: float = 10.0
    failover_grace_s: float = 30.0
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    metrics_endpoint: str = "http://0.0.0.0:8081/metrics"  # empty: no /metrics server
    build: BuildContext = field(default_factory=BuildContext)
    # The operator's ZooKeeper password (user `delayq-operator`). Set, every topic tree gets
    # ACLs (coordination/acl.py); empty, the trees stay open (a single-tenant or test install).
    zookeeper_admin_password: str = field(default="", repr=False)
    # What tenants' topics may ask of the webhook SSRF guard (tenant_policy.py): by default
    # neither allowPrivateTargets nor any allowedCidrs
    tenant_policy: TenantPolicy = field(default_factory=TenantPolicy)
    # The NetworkPolicy admitting the namespaces that hold DelayTopics to the bundled ZooKeeper
    # (kube/zookeeper_clients.py); empty: none to keep (namespaced mode, or your own ensemble)
    zookeeper_clients_policy: str = ""
    # TLS to ZooKeeper (coordination/tls.py), for every ensemble the operator connects to;
    # None: plain connections. On, it needs the platform's CA or verify_certs False explicitly
    zookeeper_tls: ZkTls | None = None
    # For the release after the credentials moved to the operator's namespace: a topic
    # provisioned before, with no copy yet, seeds it by reading its <t>-credentials once
    # (kube/credentials.py); the chart grants `get` on Secrets only with it
    legacy_secret_read: bool = False

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """DELAYQ_* variables; unset ones keep the defaults above."""
        env = os.environ if env is None else env
        defaults = cls()
        admin_password = env.get("DELAYQ_ZOOKEEPER_ADMIN_PASSWORD", "")
        admin_acl = ZkIdentity(ADMIN_USER, admin_password).acl_id if admin_password else ""
        tls = zookeeper_tls_from_env(env)
        allowed_ensembles = allowed_ensembles_from_env(env)
        build = BuildContext(
            image=env.get("DELAYQ_IMAGE", defaults.build.image),
            redis_image=env.get("DELAYQ_REDIS_IMAGE", defaults.build.redis_image),
            pipeline_image=env.get("DELAYQ_PIPELINE_IMAGE", defaults.build.pipeline_image),
            image_pull_policy=env.get("DELAYQ_IMAGE_PULL_POLICY", defaults.build.image_pull_policy),
            operator_namespace=env.get("POD_NAMESPACE", defaults.build.operator_namespace),
            default_zookeeper=env.get("DELAYQ_ZOOKEEPER", defaults.build.default_zookeeper),
            zookeeper_allowed_ensembles=allowed_ensembles,
            zookeeper_admin_acl=admin_acl,
            zookeeper_tls=tls is not None,
            zookeeper_tls_verify_certs=tls.verify_certs if tls else True,
            zookeeper_tls_ca_pem=_read(TLS_CA_FILE_ENV, tls.ca_file) if tls else "",
            service_monitor=service_monitor_from_env(env, defaults.build.service_monitor),
            placement=placement_from_env(env),
            tracing=PodTracing.from_env(env),
        )
        try:
            check_ensembles(build.zookeeper_ensembles)
        except ValueError as error:
            raise ValueError(f"DELAYQ_ZOOKEEPER, {ALLOWED_ENSEMBLES_ENV}: {error}") from None
        namespaces = tuple(
            item.strip()
            for item in env.get("DELAYQ_WATCH_NAMESPACES", "").split(",")
            if item.strip()
        )
        return cls(
            namespaces=namespaces,
            leader_lease_name=env.get("DELAYQ_LEASE_NAME", defaults.leader_lease_name),
            standalone=_flag(env.get("DELAYQ_STANDALONE")),
            health_interval_s=float(
                env.get("DELAYQ_HEALTH_INTERVAL_S", defaults.health_interval_s)
            ),
            failover_grace_s=float(env.get("DELAYQ_FAILOVER_GRACE_S", defaults.failover_grace_s)),
            liveness_endpoint=env.get("DELAYQ_LIVENESS", defaults.liveness_endpoint),
            metrics_endpoint=env.get("DELAYQ_METRICS", defaults.metrics_endpoint),
            build=build,
            zookeeper_admin_password=admin_password,
            tenant_policy=TenantPolicy.from_env(env),
            zookeeper_clients_policy=env.get(CLIENTS_POLICY_ENV, ""),
            zookeeper_tls=tls,
            legacy_secret_read=_flag(env.get("DELAYQ_LEGACY_SECRET_READ")),
        )


def allowed_ensembles_from_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """DELAYQ_ZOOKEEPER_ALLOWED_ENSEMBLES: a JSON list of connection strings (they hold commas),
    the chart's `zookeeper.allowedEnsembles`."""
    ensembles = json.loads(env.get(ALLOWED_ENSEMBLES_ENV) or "[]")
    if not isinstance(ensembles, list) or not all(isinstance(e, str) for e in ensembles):
        raise ValueError(f"{ALLOWED_ENSEMBLES_ENV} must be a JSON list of connection strings")
    return tuple(ensembles)


TLS_ENV = "DELAYQ_ZOOKEEPER_TLS"
TLS_CA_FILE_ENV = "DELAYQ_ZOOKEEPER_TLS_CA_FILE"
TLS_VERIFY_ENV = "DELAYQ_ZOOKEEPER_TLS_VERIFY_CERTS"


def zookeeper_tls_from_env(env: Mapping[str, str]) -> ZkTls | None:
    """DELAYQ_ZOOKEEPER_TLS (on/off), _CA_FILE, _CERT_FILE, _KEY_FILE (PEM paths) and
    _VERIFY_CERTS (default on): the variables of `delayq serve`'s settings of the same names."""
    if not _flag(env.get(TLS_ENV)):
        return None
    # strict: a typo must not switch the server's authentication off
    verify = env.get(TLS_VERIFY_ENV, "true").strip().lower()
    if verify not in ("true", "false"):
        raise ValueError(f"{TLS_VERIFY_ENV} must be true or false, not {verify!r}")
    ca_file = env.get(TLS_CA_FILE_ENV, "")
    if verify == "true" and not ca_file:
        # the system CAs would accept any public certificate of any host name
        raise ValueError(
            f"{TLS_CA_FILE_ENV} must name the ensembles' CA when {TLS_ENV} is on "
            f"(or set {TLS_VERIFY_ENV}=false: encrypted, not authenticated)"
        )
    return ZkTls(
        ca_file=ca_file,
        cert_file=env.get("DELAYQ_ZOOKEEPER_TLS_CERT_FILE", ""),
        key_file=env.get("DELAYQ_ZOOKEEPER_TLS_KEY_FILE", ""),
        verify_certs=verify == "true",
    )


def _read(variable: str, path: str) -> str:
    """The text of a file the operator copies ("" for no path); a ValueError names the
    variable that named it."""
    if not path:
        return ""
    try:
        return Path(path).read_text()
    except OSError as error:
        raise ValueError(f"{variable}={path}: {error.strerror or error}") from None


def service_monitor_from_env(
    env: Mapping[str, str], defaults: ServiceMonitorSettings
) -> ServiceMonitorSettings:
    """DELAYQ_SERVICE_MONITOR (on/off), _LABELS (a JSON object of strings), _INTERVAL."""
    labels = json.loads(env.get("DELAYQ_SERVICE_MONITOR_LABELS") or "{}")
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError("DELAYQ_SERVICE_MONITOR_LABELS must be a JSON object of strings")
    enabled = env.get("DELAYQ_SERVICE_MONITOR")
    return ServiceMonitorSettings(
        enabled=defaults.enabled if enabled is None else _flag(enabled),
        labels=tuple(sorted(labels.items())),
        interval=env.get("DELAYQ_SERVICE_MONITOR_INTERVAL", defaults.interval),
    )


def placement_from_env(env: Mapping[str, str]) -> PodPlacement:
    """DELAYQ_TOPIC_NODE_SELECTOR (a JSON object of strings) and DELAYQ_TOPIC_TOLERATIONS (a
    JSON list of Kubernetes tolerations), the chart's `topics.nodeSelector` / `tolerations`."""
    selector = json.loads(env.get("DELAYQ_TOPIC_NODE_SELECTOR") or "{}")
    if not isinstance(selector, dict) or not all(
        isinstance(value, str) for value in selector.values()
    ):
        raise ValueError("DELAYQ_TOPIC_NODE_SELECTOR must be a JSON object of strings")
    tolerations = json.loads(env.get("DELAYQ_TOPIC_TOLERATIONS") or "[]")
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise ValueError("DELAYQ_TOPIC_TOLERATIONS must be a JSON list of tolerations (objects)")
    return PodPlacement(
        node_selector=tuple(sorted(selector.items())), tolerations=tuple(tolerations)
    )


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
