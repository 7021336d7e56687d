"""The delay-service side of a topic: StatefulSet, Services, config, credentials, PDB, monitor.

One StatefulSet with one pod per broker: pod `<topic>-service-<i>` prefers the slots of broker
`i` (ZooKeeper decides ownership). Scheduling spreads the service pods across nodes and prefers
nodes running a Redis master of the topic (a pod rescheduled later goes where a master is); the
specific pairing of service pod `i` with broker `i`'s first master is made from the Redis side
(redis.redis_affinity), because one pod template cannot name a different broker per pod. The
pod template carries a hash of everything the process reads at start, so a config or worker
change rolls the pods.
"""

from __future__ import annotations

import base64
import hashlib
import json

from delayq.kube import naming
from delayq.kube.builders.common import (
    SERVICE_UID,
    BuildContext,
    Credentials,
    Manifest,
    container_security_context,
    delivery_stream_key,
    env_from_field,
    env_from_secret,
    metadata,
    pod_security_context,
    preferred_term,
    resources,
    tmp_volume,
)
from delayq.kube.spec import TopicSpec
from delayq.service.topic_file import TopicFile


def zookeeper_connect(spec: TopicSpec, ctx: BuildContext) -> str:
    return spec.zookeeper_connect or ctx.default_zookeeper


def topic_file(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> TopicFile:
    """What `delayq serve` reads from /etc/delayq/topic.json (contract: `TopicFile`).

    `slot_amount` is the applied amount, which lags the spec while a growth is rejected.
    """
    delivery = spec.delivery
    return TopicFile(
        namespace=spec.namespace,
        topic=spec.name,
        slot_amount=slot_amount,
        topic_type=spec.topic_type,
        brokers=spec.brokers,
        max_retries=spec.max_retries,
        ack_timeout_ms=spec.ack_timeout_ms,
        max_payload_bytes=spec.max_payload_bytes,
        journal_max_len=spec.journal_max_len,
        webhook_url=delivery.webhook_url,
        webhook_timeout_ms=delivery.webhook_timeout_ms,
        webhook_max_in_flight=delivery.webhook_max_in_flight,
        webhook_allow_private_targets=delivery.webhook_allow_private_targets,
        webhook_allowed_cidrs=",".join(delivery.webhook_allowed_cidrs),
        pull_max_lease_batch=delivery.pull_max_lease_batch,
        stream_key=delivery_stream_key(spec),
        stream_max_len=delivery.stream_max_len,
        zookeeper_connect=zookeeper_connect(spec, ctx),
        zookeeper_session_timeout_ms=spec.zookeeper_session_timeout_ms,
        zookeeper_admin_acl=ctx.zookeeper_admin_acl,
        worker_concurrency=spec.worker_concurrency,
        redis_master_host_template=f"{spec.name}-redis-{{broker}}.{spec.namespace}.svc",
        redis_port=naming.REDIS_PORT,
        http_port=naming.SERVICE_HTTP_PORT,
    )


def config_json(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> str:
    return topic_file(spec, ctx, slot_amount).to_json()


def config_hash(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> str:
    """Changes exactly when a restart of the service pods is needed to pick up new settings."""
    material = config_json(spec, ctx, slot_amount) + json.dumps(
        spec.worker_resources.as_manifest(), sort_keys=True
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def config_map(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> Manifest:
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(naming.config_map(spec.name), spec.namespace, labels),
        "data": {naming.CONFIG_KEY: config_json(spec, ctx, slot_amount)},
    }


def credentials_secret(spec: TopicSpec, credentials: Credentials) -> Manifest:
    """The topic's Redis passwords (service and admin user), API token and ZooKeeper password;
    their values are never rewritten by the operator (apply.py adds a missing key only)."""
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(naming.credentials_secret(spec.name), spec.namespace, labels),
        "data": {
            naming.SECRET_REDIS_PASSWORD: _b64(credentials.redis_password),
            naming.SECRET_API_TOKEN: _b64(credentials.api_token),
            naming.SECRET_ZOOKEEPER_PASSWORD: _b64(credentials.zookeeper_password),
            naming.SECRET_REDIS_ADMIN_PASSWORD: _b64(credentials.redis_admin_password),
        },
    }


def service_statefulset(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> Manifest:
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    secret = naming.credentials_secret(spec.name)
    tmp, tmp_mount = tmp_volume()
    master_labels = {
        naming.LABEL_TOPIC: spec.name,
        naming.LABEL_COMPONENT: naming.COMPONENT_REDIS,
        naming.LABEL_ROLE: naming.ROLE_MASTER,
    }
    container: Manifest = {
        "name": "delay-service",
        "image": ctx.image,
        "imagePullPolicy": ctx.image_pull_policy,
        "args": ["serve", "--config", f"{naming.CONFIG_MOUNT}/{naming.CONFIG_KEY}"],
        "env": [
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_NAMESPACE", "metadata.namespace"),
            env_from_secret("DELAYQ_REDIS_PASSWORD", secret, naming.SECRET_REDIS_PASSWORD),
            env_from_secret("DELAYQ_API_TOKEN", secret, naming.SECRET_API_TOKEN),
            env_from_secret(
                "DELAYQ_ZOOKEEPER_PASSWORD", secret, naming.SECRET_ZOOKEEPER_PASSWORD
            ),
        ],
        "ports": [{"name": "http", "containerPort": naming.SERVICE_HTTP_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": resources(
            spec.worker_resources, {"cpu": "100m", "memory": "128Mi"}, {"memory": "256Mi"}
        ),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": naming.CONFIG_MOUNT, "readOnly": True},
            tmp_mount,
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(naming.service_statefulset(spec.name), spec.namespace, labels),
        "spec": {
            "serviceName": naming.service_headless_service(spec.name),
            "replicas": spec.brokers,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": naming.service_selector(spec.name)},
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": {
                        naming.CONFIG_HASH_ANNOTATION: config_hash(spec, ctx, slot_amount)
                    },
                },
                "spec": {
                    "securityContext": pod_security_context(SERVICE_UID),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 30,
                    "affinity": {
                        "podAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                preferred_term(50, master_labels, "kubernetes.io/hostname")
                            ]
                        },
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                preferred_term(
                                    100,
                                    naming.service_selector(spec.name),
                                    "kubernetes.io/hostname",
                                )
                            ]
                        },
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": naming.service_selector(spec.name)},
                        }
                    ],
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": naming.config_map(spec.name)}},
                        tmp,
                    ],
                },
            },
        },
    }


def service_headless_service(spec: TopicSpec) -> Manifest:
    return _service(spec, naming.service_headless_service(spec.name), headless=True)


def api_service(spec: TopicSpec) -> Manifest:
    """The topic's HTTP API (schedule, lease, ack, metrics) for producers and consumers."""
    service = _service(spec, naming.api_service(spec.name), headless=False)
    service["metadata"]["labels"][naming.LABEL_ENDPOINT] = "api"
    return service


def service_pdb(spec: TopicSpec) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(
            naming.service_statefulset(spec.name),
            spec.namespace,
            naming.topic_labels(spec.name, naming.COMPONENT_SERVICE),
        ),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.service_selector(spec.name)},
        },
    }


def service_monitor(spec: TopicSpec) -> Manifest:
    """Prometheus Operator scrape config; rendered only when the ServiceMonitor CRD exists."""
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(naming.api_service(spec.name), spec.namespace, labels),
        "spec": {
            "selector": {
                "matchLabels": {naming.LABEL_TOPIC: spec.name, naming.LABEL_ENDPOINT: "api"}
            },
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}],
        },
    }


def _service(spec: TopicSpec, name: str, headless: bool) -> Manifest:
    body: Manifest = {
        "selector": naming.service_selector(spec.name),
        "ports": [
            {"name": "http", "port": naming.SERVICE_HTTP_PORT, "targetPort": "http"},
        ],
    }
    if headless:
        body["clusterIP"] = "None"
        body["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            name, spec.namespace, naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
        ),
        "spec": body,
    }


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()
