"""Pieces every pod of a topic shares: hardened security contexts, resources, metadata.

Every container runs as a non-root user with a read-only root filesystem and no capabilities;
anything that must write gets an explicit volume.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from delayq import __version__
from delayq.kube import naming
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.spec import Resources, TopicSpec
from delayq.queue.topic import TopicType

Manifest = dict[str, Any]


def secret_value(value: str) -> str:
    """A Secret's `data` value: the base64 of the text's UTF-8 bytes."""
    return base64.b64encode(value.encode()).decode()


REDIS_UID = 999  # the `redis` user of the official image
SERVICE_UID = 10001  # the `delayq` user of the project image (see the Dockerfile)

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
# Set by the StatefulSet controller on every pod it creates: the one label that tells one pod of
# a StatefulSet from its siblings, so an affinity term can aim at a single pod.
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"


@dataclass(frozen=True)
class ServiceMonitorSettings:
    """The ServiceMonitor of each topic's delay-service pods (rendered when its CRD is served).

    `labels` are what the cluster's Prometheus selects ServiceMonitors by (e.g. `release`);
    `enabled` False renders none, for clusters that scrape another way or not at all.
    """

    enabled: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    interval: str = "30s"


@dataclass(frozen=True)
class PodPlacement:
    """Where every topic's Redis and delay-service pods may run, set once for the operator
    (chart `topics.nodeSelector` / `topics.tolerations`): e.g. a node pool a platform keeps
    for delayq. Empty, the pods go wherever the scheduler and their affinities put them."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Manifest, ...] = ()

    def pod_spec_fields(self) -> Manifest:
        """The pod spec fields to merge into a topic pod template (none when unset, so that
        templates of operators without a placement stay as they were)."""
        fields: Manifest = {}
        if self.node_selector:
            fields["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            fields["tolerations"] = [dict(toleration) for toleration in self.tolerations]
        return fields


@dataclass(frozen=True)
class BuildContext:
    """Operator-wide inputs to the builders (images, where the operator runs, ZooKeeper)."""

    image: str = f"ghcr.io/delayq/delayq:{__version__}"
    # an exact patch release (chart `operator.redisImage`, which may add a digest): a floating
    # minor tag under IfNotPresent runs whatever patch a node pulled first
    redis_image: str = "redis:7.4.11-bookworm"
    image_pull_policy: str = "IfNotPresent"
    # the pipeline image (Spark): the Jobs of the topics' scheduled backups (chart
    # `pipeline.image`); the platform's choice, never a tenant's
    pipeline_image: str = f"ghcr.io/delayq/delayq-pipeline:{__version__}"
    operator_namespace: str = "delayq-system"
    default_zookeeper: str = "zookeeper.delayq-system.svc:2181"
    # the other ensembles a topic may select with spec.zookeeper.connect (kube/ensembles.py)
    zookeeper_allowed_ensembles: tuple[str, ...] = ()
    # the operator's ZooKeeper ACL id (`delayq-operator:<hash>`, no secret): topic.json hands
    # it to the services so the nodes they create stay the operator's too; empty: no ACLs
    zookeeper_admin_acl: str = ""
    # TLS to ZooKeeper for the service pods (coordination/tls.py): the operator's CA
    # certificate(s) in PEM are copied into every topic's ConfigMap, as a pod cannot mount a
    # Secret of the operator's namespace; empty: the system CAs
    zookeeper_tls: bool = False
    zookeeper_tls_verify_certs: bool = True
    zookeeper_tls_ca_pem: str = ""
    service_monitor: ServiceMonitorSettings = field(default_factory=ServiceMonitorSettings)
    placement: PodPlacement = field(default_factory=PodPlacement)
    # the platform's traces of the delay-service pods (chart topics.tracing); default: off
    tracing: PodTracing = field(default_factory=PodTracing)

    @property
    def zookeeper_ensembles(self) -> tuple[str, ...]:
        """Every ensemble the operator may connect to, its default first."""
        return tuple(dict.fromkeys((self.default_zookeeper, *self.zookeeper_allowed_ensembles)))


@dataclass(frozen=True)
class Credentials:
    """A topic's generated secrets (its Secret's values), supplied by the reconcile handler."""

    redis_password: str
    api_token: str
    zookeeper_password: str
    redis_admin_password: str
    read_token: str
    metrics_token: str
    lease_token_key: str
    # the operator's own /metrics credential (spec.objectives), not the tenant's to rotate
    operator_metrics_token: str
    # the stream reader's Redis password (its own Secret); empty when the topic has no reader
    stream_reader_password: str = ""
    # the backups' read-only Redis user's password; empty while the topic has no spec.backup
    backup_password: str = ""


def delivery_stream_key(spec: TopicSpec) -> str:
    """The target stream of a stream topic: `spec.delivery.stream.streamKey` or the default."""
    return spec.delivery.stream_key or f"dq-out:{spec.namespace}/{spec.name}"


def has_stream_reader(spec: TopicSpec) -> bool:
    """A stream topic writing to its own broker 0 (no `delivery.stream.urlSecretRef`): its
    consumers read there, as the operator's reader user, admitted by `allowFrom`."""
    return spec.topic_type is TopicType.STREAM and spec.delivery.stream_url_secret_ref is None


def metadata(name: str, namespace: str, labels: dict[str, str]) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def hashed_network_policy(
    name: str, namespace: str, labels: dict[str, str], rules: Manifest
) -> Manifest:
    """A NetworkPolicy whose annotation hashes its rules: apply.contains() cannot see a removed
    field (an `except` dropped, a narrower selector, a peer taken out), so the hash makes every
    change a patch."""
    policy_hash = hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()[:16]
    meta = metadata(name, namespace, labels)
    meta["annotations"] = {naming.POLICY_HASH_ANNOTATION: policy_hash}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": rules,
    }


def pod_security_context(uid: int) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


def resources(
    given: Resources, default_requests: dict[str, str], default_limits: dict[str, str]
) -> Manifest:
    """The user's requests/limits, or sane defaults per side when a side is left empty."""
    return {
        "requests": dict(given.requests) or dict(default_requests),
        "limits": dict(given.limits) or dict(default_limits),
    }


def tmp_volume() -> tuple[Manifest, Manifest]:
    """An in-memory /tmp (shells and libraries expect one; the root fs is read-only)."""
    volume = {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
    mount = {"name": "tmp", "mountPath": "/tmp"}
    return volume, mount


def env_from_field(name: str, field_path: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def env_from_secret(name: str, secret: str, key: str, *, optional: bool = False) -> Manifest:
    """`optional`: a key the Secret may lack (the variable is then unset); otherwise the pod
    does not start without it."""
    selector: Manifest = {"name": secret, "key": key}
    if optional:
        selector["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": selector}}


def operator_peer(ctx: BuildContext) -> Manifest:
    """The operator's pods as a NetworkPolicy peer (failover commands, health checks)."""
    return {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": ctx.operator_namespace}
        },
        "podSelector": {"matchLabels": dict(naming.OPERATOR_POD_LABELS)},
    }


def preferred_term(weight: int, labels: dict[str, str], topology_key: str) -> Manifest:
    return {
        "weight": weight,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": dict(labels)},
            "topologyKey": topology_key,
        },
    }
