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
    hashed_network_policy,
    metadata,
    operator_peer,
    pod_security_context,
    preferred_term,
    resources,
    secret_value,
    tmp_volume,
)
from delayq.kube.ensembles import platform_connect
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.spec import TopicSpec, zookeeper_ports
from delayq.queue import TopicType
from delayq.queue.settings import SETTINGS
from delayq.queue.topic_record import RECORDED_FIELDS
from delayq.service.config import env_name
from delayq.service.delivery.targets import parse_cidrs
from delayq.service.shutdown import GRACE_MS, termination_grace_s
from delayq.service.topic_file import TopicFile

# What a webhook's egress rule leaves out unless the topic allows non-public targets: the
# ranges of the SSRF guard (service/delivery/targets.py) that a NetworkPolicy can name, i.e.
# the cluster's pod and Service networks in every common setup, the node, the cloud metadata
# address. The guard in the process also refuses the rest (multicast, reserved, mapped forms);
# this is the second line, which holds even if the process is compromised.
NON_PUBLIC_IPV4 = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "127.0.0.0/8",
    "100.64.0.0/10",
)
# 64:ff9b::/96 too: on a NAT64 cluster it reaches the IPv4 address it embeds (the SSRF guard
# judges it as that address, so this line must not admit it either)
NON_PUBLIC_IPV6 = ("fc00::/7", "fe80::/10", "64:ff9b::/96")


def zookeeper_connect(spec: TopicSpec, ctx: BuildContext) -> str:
    """The platform's connection string of the ensemble the topic selects (never the tenant's
    string: kube/ensembles.py); raises EnsembleRefused when it selects none."""
    return platform_connect(spec.zookeeper_connect, ctx.zookeeper_ensembles)


def topic_file(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> TopicFile:
    """What `delayq serve` reads from /etc/delayq/topic.json (contract: `TopicFile`).

    `slot_amount` is the applied amount, which lags the spec while a growth is rejected.
    """
    delivery = spec.delivery
    settings = {row.name: spec.setting(row.name) for row in SETTINGS if row.serve}
    return TopicFile(
        namespace=spec.namespace,
        topic=spec.name,
        brokers=spec.brokers,
        settings={**settings, "slot_amount": slot_amount},
        webhook_url=delivery.webhook_url,
        webhook_allowed_cidrs=",".join(delivery.webhook_allowed_cidrs),
        stream_key=delivery_stream_key(spec),
        stream_allowed_cidrs=",".join(delivery.stream_allowed_cidrs),
        zookeeper_connect=zookeeper_connect(spec, ctx),
        zookeeper_admin_acl=ctx.zookeeper_admin_acl,
        zookeeper_tls=ctx.zookeeper_tls,
        zookeeper_tls_ca_file=(
            f"{naming.CONFIG_MOUNT}/{naming.ZOOKEEPER_CA_KEY}" if ctx.zookeeper_tls_ca_pem else ""
        ),
        zookeeper_tls_verify_certs=ctx.zookeeper_tls_verify_certs,
        redis_master_host_template=f"{spec.name}-redis-{{broker}}.{spec.namespace}.svc",
        redis_port=naming.REDIS_PORT,
        http_port=naming.SERVICE_HTTP_PORT,
    )


def config_json(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> str:
    return topic_file(spec, ctx, slot_amount).to_json()


def config_hash(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> str:
    """Changes exactly when a restart of the service pods is needed to pick up new settings.
    The engine's live settings are left out: the health pass publishes them in the topic's
    settings record, which every client's scripts obey at once (queue/topic_record.py)."""
    document = json.loads(config_json(spec, ctx, slot_amount))
    rolled = {key: value for key, value in document.items() if key not in RECORDED_FIELDS}
    material = (
        json.dumps(rolled, sort_keys=True)
        + json.dumps(spec.worker_resources.as_manifest(), sort_keys=True)
        + ctx.zookeeper_tls_ca_pem  # a new CA rolls the pods rather than waiting for the kubelet
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def config_map(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> Manifest:
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(naming.config_map(spec.name), spec.namespace, labels),
        "data": {
            naming.CONFIG_KEY: config_json(spec, ctx, slot_amount),
            **(
                {naming.ZOOKEEPER_CA_KEY: ctx.zookeeper_tls_ca_pem}
                if ctx.zookeeper_tls_ca_pem
                else {}
            ),
        },
    }


def credentials_secret(spec: TopicSpec, credentials: Credentials) -> Manifest:
    """The topic's Redis passwords (service and admin user), API, read-only and /metrics
    tokens (the tenant's and the operator's own), lease-token key and ZooKeeper password,
    from the operator's copy (kube/credentials.py); a reconcile leaves the tokens the tenant
    may rotate as they are, and the key it does not write (api-token-previous) to the tenant."""
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(naming.credentials_secret(spec.name), spec.namespace, labels),
        "data": {
            naming.SECRET_REDIS_PASSWORD: secret_value(credentials.redis_password),
            naming.SECRET_API_TOKEN: secret_value(credentials.api_token),
            naming.SECRET_ZOOKEEPER_PASSWORD: secret_value(credentials.zookeeper_password),
            naming.SECRET_REDIS_ADMIN_PASSWORD: secret_value(credentials.redis_admin_password),
            naming.SECRET_READ_TOKEN: secret_value(credentials.read_token),
            naming.SECRET_METRICS_TOKEN: secret_value(credentials.metrics_token),
            naming.SECRET_LEASE_TOKEN_KEY: secret_value(credentials.lease_token_key),
            naming.SECRET_OPERATOR_METRICS_TOKEN: secret_value(
                credentials.operator_metrics_token
            ),
            # the scheduled backups' pods read it (kube/builders/backup.py); kept once written
            **(
                {naming.SECRET_BACKUP_PASSWORD: secret_value(credentials.backup_password)}
                if credentials.backup_password
                else {}
            ),
        },
    }


def service_statefulset(spec: TopicSpec, ctx: BuildContext, slot_amount: int) -> Manifest:
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    secret = naming.credentials_secret(spec.name)
    tmp, tmp_mount = tmp_volume()
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
            env_from_secret("DELAYQ_READ_TOKEN", secret, naming.SECRET_READ_TOKEN),
            # /metrics is closed: its generated token (the ServiceMonitor presents it), the API
            # and read tokens open it too
            env_from_secret("DELAYQ_METRICS_TOKEN", secret, naming.SECRET_METRICS_TOKEN),
            # the operator's own, for spec.objectives: the tenant may rotate the one above
            env_from_secret(
                "DELAYQ_OPERATOR_METRICS_TOKEN", secret, naming.SECRET_OPERATOR_METRICS_TOKEN
            ),
            # one key for every pod: a lease token from one is honoured by all (tokens.py)
            env_from_secret("DELAYQ_LEASE_TOKEN_KEY", secret, naming.SECRET_LEASE_TOKEN_KEY),
            # the key the tenant adds to rotate the API token (docs/operator.md, "Rotating the
            # API token"); absent, serve accepts the current token only
            env_from_secret(
                "DELAYQ_API_TOKEN_PREVIOUS",
                secret,
                naming.SECRET_API_TOKEN_PREVIOUS,
                optional=True,
            ),
            env_from_secret("DELAYQ_ZOOKEEPER_PASSWORD", secret, naming.SECRET_ZOOKEEPER_PASSWORD),
            # a broker or ZooKeeper down at start is waited for, alive and unready, rather than
            # a restart into the kubelet's growing back-off (service/starting.py)
            {"name": env_name("wait_for_brokers"), "value": "true"},
            *_tenant_secret_env(spec),
            *_tracing(spec, ctx).pod_env(spec.namespace, naming.service_statefulset(spec.name)),
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
                    "terminationGracePeriodSeconds": termination_grace_s(
                        spec.topic_type, spec.delivery.webhook_timeout_ms, GRACE_MS
                    ),
                    "affinity": {
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
                    **ctx.placement.pod_spec_fields(),
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": naming.config_map(spec.name)}},
                        tmp,
                    ],
                },
            },
        },
    }


def _tenant_secret_env(spec: TopicSpec) -> list[Manifest]:
    """The webhook's URL (when from a Secret), signing secrets and extra headers, the external
    stream target's URL, from the tenant's Secrets (required: a topic that asks to sign never
    sends unsigned, one with an external target never writes elsewhere; without the Secret the
    pod does not start and says so in its events). The kubelet reads them, so the operator
    needs no access, and they are in no ConfigMap."""
    delivery = spec.delivery
    refs = (
        ("webhook_url", delivery.webhook_url_secret_ref),
        ("webhook_secret", delivery.webhook_signing_secret_ref),
        ("webhook_extra_headers", delivery.webhook_extra_headers_secret_ref),
        ("stream_url", delivery.stream_url_secret_ref),
    )
    return [env_from_secret(env_name(name), ref.name, ref.key) for name, ref in refs if ref]


def _tracing(spec: TopicSpec, ctx: BuildContext) -> PodTracing:
    """The platform's tracing for this topic's pods: off where the topic opted out."""
    return ctx.tracing if spec.tracing_enabled else PodTracing()


def service_network_policy(spec: TopicSpec, ctx: BuildContext) -> Manifest:
    """What the delay-service pods may receive and send: nothing else.

    Ingress, port 8080 only (API, /metrics, probes; the kubelet's probes come from the node,
    which a NetworkPolicy always admits): pods of the topic's own namespace, the operator, and
    the tenant's `networkPolicy.allowFrom` peers (a Prometheus in another namespace).
    Egress: DNS, the topic's Redis pods, ZooKeeper, the platform's trace collector where the
    topic is traced and, for webhook topics and stream topics with an external target, public
    addresses and the topic's allowedCidrs.
    """
    port = {"protocol": "TCP", "port": naming.SERVICE_HTTP_PORT}
    rules: Manifest = {
        "podSelector": {"matchLabels": naming.service_selector(spec.name)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"podSelector": {}},
                    operator_peer(ctx),
                    *spec.network_policy_allow_from,
                ],
                "ports": [port],
            }
        ],
        "egress": _service_egress(spec, ctx),
    }
    return hashed_network_policy(
        naming.service_network_policy(spec.name),
        spec.namespace,
        naming.topic_labels(spec.name, naming.COMPONENT_SERVICE),
        rules,
    )


def _service_egress(spec: TopicSpec, ctx: BuildContext) -> list[Manifest]:
    # DNS to any address rather than to `k8s-app: kube-dns` pods: clusters differ (NodeLocal
    # DNSCache answers on a link-local node address no pod selector matches, OpenShift and
    # some managed clusters label their resolver otherwise), and a wrong guess breaks every
    # name lookup, the Redis master Service's included. What it leaves open is port 53 only.
    rules: list[Manifest] = [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {
            "to": [{"podSelector": {"matchLabels": naming.redis_selector(spec.name)}}],
            "ports": [{"protocol": "TCP", "port": naming.REDIS_PORT}],
        },
        # ZooKeeper is a connection string of names, often outside the cluster (bring your
        # own ensemble): its addresses are unknown here, its ports are not (the platform's
        # string: a tenant's could name any port)
        {
            "ports": [
                {"protocol": "TCP", "port": port}
                for port in zookeeper_ports(zookeeper_connect(spec, ctx))
            ]
        },
    ]
    tracing = _tracing(spec, ctx)
    if tracing.otlp_endpoint:
        # the platform's collector, a name like ZooKeeper's ensemble: its port, any address
        rules.append({"ports": [{"protocol": "TCP", "port": tracing.port}]})
    delivery = spec.delivery
    if spec.topic_type is TopicType.WEBHOOK:
        targets = _targets(delivery.webhook_allow_private_targets, delivery.webhook_allowed_cidrs)
        rules.append({"to": targets, "ports": [{"protocol": "TCP"}]})
    elif spec.topic_type is TopicType.STREAM and delivery.stream_url_secret_ref is not None:
        targets = _targets(delivery.stream_allow_private_targets, delivery.stream_allowed_cidrs)
        rules.append({"to": targets, "ports": [{"protocol": "TCP"}]})
    return rules


def _targets(allow_private: bool, allowed_cidrs: tuple[str, ...]) -> list[Manifest]:
    """Where a webhook or an external stream target may be reached: every address but the
    non-public ones (all of them with allowPrivateTargets), plus the topic's allowedCidrs (any
    TCP port: the URL names the target's, which the operator does not see; for a webhook the
    SSRF guard checks the address it resolves to)."""
    if allow_private:
        return [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    # written as networks: the guard accepts host bits (10.1.2.3/8), a policy's cidr may not
    allowed = parse_cidrs(allowed_cidrs)
    return [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NON_PUBLIC_IPV4)}},
        {"ipBlock": {"cidr": "::/0", "except": list(NON_PUBLIC_IPV6)}},
        *({"ipBlock": {"cidr": str(network)}} for network in allowed),
    ]


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
    """Prometheus Operator scrape config, with the topic's /metrics token; rendered only when
    the ServiceMonitor CRD exists."""
    labels = naming.topic_labels(spec.name, naming.COMPONENT_SERVICE)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(naming.api_service(spec.name), spec.namespace, labels),
        "spec": {
            "selector": {
                "matchLabels": {naming.LABEL_TOPIC: spec.name, naming.LABEL_ENDPOINT: "api"}
            },
            # /metrics needs the topic's metrics-token; a ServiceMonitor's bearerTokenSecret
            # must be in its own namespace, which the credentials Secret is
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": "30s",
                    "bearerTokenSecret": {
                        "name": naming.credentials_secret(spec.name),
                        "key": naming.SECRET_METRICS_TOKEN,
                    },
                }
            ],
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
