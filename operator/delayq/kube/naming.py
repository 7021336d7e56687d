"""Names, labels and annotations shared by the builders, the handlers and the chart.

One module so that a name written by a builder and one the failover writes can never drift
apart.
"""

from __future__ import annotations

from delayq.queue.settings import MAX_BROKERS, MAX_REPLICAS_PER_BROKER

GROUP = "delayq.io"
VERSION = "v1alpha1"
PLURAL = "delaytopics"
KIND = "DelayTopic"

FINALIZER = "delayq.io/finalizer"
PAUSED_ANNOTATION = "delayq.io/paused"
CONFIG_HASH_ANNOTATION = "delayq.io/config-hash"
# on the delay-service NetworkPolicy: changes with every rule, so a loosened rule is patched too
POLICY_HASH_ANNOTATION = "delayq.io/policy-hash"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TOPIC = "delayq.io/topic"
LABEL_BROKER = "delayq.io/broker"
LABEL_ENDPOINT = "delayq.io/endpoint"
# Read only, for an upgrade: the master's pod label of operators before the master record.
LEGACY_LABEL_ROLE = "delayq.io/redis-role"
LEGACY_ROLE_MASTER = "master"
# The master Service's EndpointSlice (kube/master_endpoint.py): the label that ties a slice to
# its Service, and the manager's label, which keeps Kubernetes' own slice controllers off it.
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
SLICE_MANAGER = "delayq.io-operator"

APP_NAME = "delayq"
MANAGED_BY = "delayq-operator"
COMPONENT_REDIS = "redis"
COMPONENT_SERVICE = "delay-service"
COMPONENT_BACKUP = "backup"  # the pods of a topic's scheduled backups (kube/builders/backup.py)
OPERATOR_POD_LABELS = {LABEL_NAME: "delayq-operator"}

REDIS_PORT = 6379
SERVICE_HTTP_PORT = 8080
SECRET_REDIS_PASSWORD = "redis-password"  # the delay services' Redis user
SECRET_REDIS_ADMIN_PASSWORD = "redis-admin-password"  # the operator's and replication's user
SECRET_API_TOKEN = "api-token"
# generated like api-token: reads and /metrics only (the dashboard for people who only look)
SECRET_READ_TOKEN = "read-token"
# set by the tenant, never by the operator: the token being rotated out
SECRET_API_TOKEN_PREVIOUS = "api-token-previous"
# generated like api-token (a tenant's own value is kept): /metrics, which the pods require and
# the topic's ServiceMonitor presents (bearerTokenSecret)
SECRET_METRICS_TOKEN = "metrics-token"
# generated, the operator's (repaired from its copy like the passwords, never the tenant's to
# rotate): the operator's own credential for /metrics, which it reads for spec.objectives; the
# pods accept it there only, so a tenant rotating metrics-token does not lock the operator out
SECRET_OPERATOR_METRICS_TOKEN = "operator-metrics-token"
# generated like api-token: the key of the pull lease tokens' HMAC, shared by the topic's pods
# (service/tokens.py); a new value makes the outstanding leases' tokens refused (403)
SECRET_LEASE_TOKEN_KEY = "lease-token-key"
SECRET_ZOOKEEPER_PASSWORD = "zookeeper-password"
# the read-only Redis user of the topic's scheduled backups (spec.backup), generated with it
SECRET_BACKUP_PASSWORD = "backup-password"
# the Secret <topic>-stream-reader (stream topics written to their own broker 0): the consumers'
# Redis login, made by the operator for the tenant's consumer pods to mount
SECRET_STREAM_READER_USERNAME = "username"
SECRET_STREAM_READER_PASSWORD = "password"
SECRET_STREAM_READER_URL = "url"
# Keys of <topic>-credentials that are the tenant's to change once written (docs/operator.md,
# "Rotating the API token"): the operator's repair of that Secret leaves them as they are
TENANT_ROTATED_KEYS = frozenset({SECRET_API_TOKEN, SECRET_READ_TOKEN, SECRET_METRICS_TOKEN})
# The operator's own copy of a topic's credentials (kube/credentials.py), in its namespace: the
# stream reader's password beside the keys of <topic>-credentials, labelled for collection
COPY_STREAM_READER_PASSWORD = "stream-reader-password"
COMPONENT_CREDENTIALS_COPY = "topic-credentials"
LABEL_TOPIC_NAMESPACE = "delayq.io/topic-namespace"
TOPIC_UID_ANNOTATION = "delayq.io/topic-uid"
CONFIG_KEY = "topic.json"
CONFIG_MOUNT = "/etc/delayq"
# the operator's ZooKeeper CA certificate(s), copied into the ConfigMap next to topic.json
ZOOKEEPER_CA_KEY = "zookeeper-ca.crt"


def is_paused(annotations: dict[str, str] | None) -> bool:
    """`delayq.io/paused: "true"` (any case) stops reconciliation; deletion still proceeds."""
    return (annotations or {}).get(PAUSED_ANNOTATION, "").lower() == "true"


def redis_statefulset(topic: str, broker: int) -> str:
    return f"{topic}-redis-{broker}"


def redis_headless_service(topic: str, broker: int) -> str:
    return f"{topic}-redis-{broker}-headless"


def redis_master_service(topic: str, broker: int) -> str:
    """The Service that always points at the broker's current master; also the name of its
    EndpointSlice, which the operator writes (kube/master_endpoint.py)."""
    return f"{topic}-redis-{broker}"


def redis_masters_config_map(topic: str) -> str:
    """Which pod is each broker's master (key `master_key(broker)`): the operator's record,
    and what a Redis pod reads when it starts (master or replica)."""
    return f"{topic}-redis-masters"


def master_key(broker: int) -> str:
    return f"broker-{broker}"


def master_record(pod: str, uid: str) -> str:
    """The value recorded for a broker's master: one pod incarnation, not just a name. A pod
    made again under the same name (new uid, maybe without its data) is not the master: it
    starts as a replica and is promoted only by a failover decision, as any other pod."""
    return f"{pod}/{uid}"


def redis_master_host(topic: str, namespace: str, broker: int) -> str:
    """The master Service's cluster DNS name: what replicas, the operator's commands and the
    slot mover reach the broker's master by, so they follow a failover."""
    return f"{redis_master_service(topic, broker)}.{namespace}.svc"


def redis_pod(topic: str, broker: int, ordinal: int) -> str:
    return f"{redis_statefulset(topic, broker)}-{ordinal}"


#: The most pods of one StatefulSet the operator makes: the service's, one per broker.
MAX_STATEFULSET_REPLICAS = max(MAX_BROKERS, 1 + MAX_REPLICAS_PER_BROKER)


def pod_ordinal(statefulset: str, pod: str) -> int | None:
    """The ordinal of `pod` if it is named as a pod of `statefulset` is (`<name>-<n>`, n below
    the most replicas the operator gives one), else None: the operator finds pods by labels,
    which anyone who may create a pod in the namespace can give one of their own."""
    ordinal = pod.removeprefix(f"{statefulset}-")
    if ordinal == pod or not ordinal.isdecimal() or not ordinal.isascii():
        return None
    if str(int(ordinal)) != ordinal or int(ordinal) >= MAX_STATEFULSET_REPLICAS:
        return None
    return int(ordinal)


def service_statefulset(topic: str) -> str:
    return f"{topic}-service"


def service_headless_service(topic: str) -> str:
    return f"{topic}-service-headless"


def api_service(topic: str) -> str:
    return f"{topic}-api"


def credentials_secret(topic: str) -> str:
    return f"{topic}-credentials"


def credentials_copy(namespace: str, topic: str) -> str:
    """The operator's copy of a topic's credentials, in the operator's namespace. A namespace
    name is a DNS label (no '.') and so is a topic's (DNS-1035), so the first '.' after the
    prefix ends the namespace: no two (namespace, topic) pairs share a name (`a`/`b-c` and
    `a-b`/`c` are `...a.b-c` and `...a-b.c`); at most 19 + 63 + 1 + 43 characters."""
    return f"delayq-credentials.{namespace}.{topic}"


def stream_reader_secret(topic: str) -> str:
    return f"{topic}-stream-reader"


def stream_reader_network_policy(topic: str) -> str:
    """Admits the topic's `networkPolicy.allowFrom` peers to broker 0's Redis (its stream)."""
    return f"{topic}-redis-readers"


def backup_cron_job(topic: str) -> str:
    """At most 43 + 7 characters: a CronJob's name may have 52 (its Jobs append 11)."""
    return f"{topic}-backup"


def backup_selector(topic: str) -> dict[str, str]:
    return {LABEL_TOPIC: topic, LABEL_COMPONENT: COMPONENT_BACKUP}


def config_map(topic: str) -> str:
    return f"{topic}-config"


def redis_network_policy(topic: str) -> str:
    return f"{topic}-redis"


def service_network_policy(topic: str) -> str:
    return f"{topic}-service"


def topic_labels(topic: str, component: str) -> dict[str, str]:
    """Labels on every object of a topic; a subset selects its pods."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: topic,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_TOPIC: topic,
    }


def service_selector(topic: str) -> dict[str, str]:
    return {LABEL_TOPIC: topic, LABEL_COMPONENT: COMPONENT_SERVICE}


def redis_selector(topic: str, broker: int | None = None) -> dict[str, str]:
    selector = {LABEL_TOPIC: topic, LABEL_COMPONENT: COMPONENT_REDIS}
    if broker is not None:
        selector[LABEL_BROKER] = str(broker)
    return selector
