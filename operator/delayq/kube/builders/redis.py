"""The Redis side of a broker: StatefulSet (master + replicas, AOF, PVC), Services, PDB, policy.

Who is master is decided by the operator, not by the pods: the operator records one pod per
broker (that incarnation of it: name and uid) in the ConfigMap `<topic>-redis-masters` and points
the master Service (no selector) at that pod through an EndpointSlice it writes
(kube/master_endpoint.py), so it never writes pods. A pod reads the record (an env var from the
ConfigMap) when it starts: the recorded master starts as master, every other pod, and the
master's pod made again (a new uid, maybe without its data), as a replica of the master
Service. A returning old master is no longer recorded after a failover, so it restarts as a
replica and resyncs from the new master (it never overwrites it); if it kept running, the
operator demotes it with REPLICAOF (see failover.py).

A master pod that is asked to stop (rollout, drain, eviction) first waits in its preStop hook
until the operator has switched the master over to a replica (handlers/switchover.py), so a
planned restart pauses writes for milliseconds instead of failoverGraceSeconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from delayq.kube import naming
from delayq.kube.builders.common import (
    HOSTNAME_TOPOLOGY,
    POD_NAME_LABEL,
    REDIS_UID,
    BuildContext,
    Credentials,
    Manifest,
    container_security_context,
    delivery_stream_key,
    env_from_field,
    env_from_secret,
    has_stream_reader,
    hashed_network_policy,
    metadata,
    operator_peer,
    pod_security_context,
    preferred_term,
    resources,
    secret_value,
    tmp_volume,
)
from delayq.kube.quantity import memory_bytes
from delayq.kube.spec import TopicSpec
from delayq.queue import Topic, TopicType, acl

# Placement weights (the scheduler adds them per node). Spreading a broker's own pods is the
# stronger preference: a node loss must not take the master and its replica together.
BROKER_SPREAD_WEIGHT = 100
# Weaker pull of every pod of broker i towards delay-service pod i: the broker pod scheduled
# first (pod 0, created first and elected first master) lands next to it, and the spread still
# sends the replicas elsewhere (on that node: +50 for the pair, -100 twice for the spread).
SERVICE_PAIR_WEIGHT = 50

# Redis's maxmemory as a share of the container's memory limit: the rest is for what maxmemory
# does not count or cannot bound (replication and client output buffers, the AOF buffer,
# allocator fragmentation, copy-on-write pages of an AOF rewrite's fork). Without it a full
# broker is OOM-killed, restarts, replays its AOF and fills up again; with it (and noeviction,
# below) it refuses new messages and keeps serving deliveries, which free memory.
MAXMEMORY_PERCENT = 80
REDIS_DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
REDIS_DEFAULT_LIMITS = {"memory": "512Mi"}

# The role comes from the master the operator recorded (MASTER_POD: `<pod>/<uid>`, so only that
# incarnation of the pod; empty while none is recorded: then a replica); the password
# reaches redis-server on stdin so it never shows in the process list. appendfsync from
# spec.redis.appendFsync: everysec (default, Redis's own) risks the last second of writes on a
# crash of the master's node, always syncs each write before its reply; RDB snapshots are off.
# min-replicas-* is set on every pod, not only the first master, because failover promotes a
# replica without restarting it; Redis applies it only while the pod is a master.
# Users (Redis ACLs, delayq.queue.acl): `default` is off; the delay services log in as
# SERVICE_USER, limited to the topic's keys and the engine's commands (SERVICE_USER_RULES, no
# password in it); the operator and the replicas (masteruser) as ADMIN_USER with every command;
# on broker 0 of a stream topic written to its own broker, the tenant's consumers as
# STREAM_READER_USER, limited to the target stream and to reading it (STREAM_READER_RULES, set
# on that broker's pods only, so every other broker has no such user); with spec.backup, the
# scheduled backups as BACKUP_USER, the topic's keys read-only (BACKUP_USER_RULES).
# `default` is off with no password, so no client can log in as it, yet it keeps every command
# and key: Redis (7.0 here, before redis/redis#14541) replays the AOF as `default` and re-checks
# each MULTI/EXEC against its rules, and the engine's scripts reach the AOF as MULTI/EXEC, so a
# `default` without permissions silently drops every message on a restart from the AOF.
# The engine's code is a Redis Functions library the operator loads as ADMIN_USER (it replicates
# and persists with the data); SERVICE_USER may only FCALL it: no EVAL, SCRIPT, FUNCTION, DUMP or
# RESTORE. sanitize-dump-payload yes: a RESTORE payload (only ADMIN_USER may send one) is checked
# in full before Redis trusts it.
# maxmemory-policy is always noeviction: evicting keys of a delay queue loses messages, so a full
# Redis must refuse writes (OOM) instead; MAXMEMORY is 0 (no bound) without a memory limit.
REDIS_START_SCRIPT = """\
set -eu
args="--port 6379 --dir /data --appendonly yes --appendfsync $APPEND_FSYNC"
args="$args --maxmemory $MAXMEMORY --maxmemory-policy noeviction"
args="$args --replica-announce-ip $POD_IP --protected-mode no --hz 100"
args="$args --sanitize-dump-payload yes"
args="$args --min-replicas-to-write $MIN_REPLICAS_TO_WRITE"
args="$args --min-replicas-max-lag $MIN_REPLICAS_MAX_LAG_S"
if [ "${MASTER_POD:-}" = "$POD_NAME/$POD_UID" ]; then
  echo "delayq: starting as master"
else
  echo "delayq: starting as replica of $MASTER_HOST"
  args="$args --replicaof $MASTER_HOST 6379"
fi
reader=""
if [ -n "${STREAM_READER_RULES:-}" ]; then
  reader="user $STREAM_READER_USER $STREAM_READER_RULES >$STREAM_READER_PASSWORD"
fi
backup=""
if [ -n "${BACKUP_USER_RULES:-}" ]; then
  backup="user $BACKUP_USER $BACKUP_USER_RULES >$BACKUP_PASSWORD"
fi
exec redis-server - $args <<REDISCONF
user default off ~* &* +@all
user $ADMIN_USER $ADMIN_USER_RULES >$REDIS_ADMIN_PASSWORD
user $SERVICE_USER $SERVICE_USER_RULES >$REDIS_PASSWORD
$reader
$backup
masteruser $ADMIN_USER
masterauth $REDIS_ADMIN_PASSWORD
save ""
REDISCONF
"""


# How long a stopping master waits for the operator's switchover (handlers/switchover.py) before
# it stops anyway: several health passes (DELAYQ_HEALTH_INTERVAL_S, 10 s by default). Redis
# serves normally meanwhile; the hook returns as soon as the pod is no longer master, or at once
# when no replica is connected (nothing to switch to: replicasPerBroker 0, or every pod of the
# broker stopping), and on a replica. The grace period leaves Redis its own shutdown after it
# (up to 10 s of `shutdown-timeout`, for a master that still has a replica to wait for).
SWITCHOVER_WAIT_S = 30
REDIS_TERMINATION_GRACE_S = SWITCHOVER_WAIT_S + 15
REDIS_PRESTOP_SCRIPT = f"""\
export REDISCLI_AUTH="$REDIS_ADMIN_PASSWORD"
end=$(( $(date +%s) + {SWITCHOVER_WAIT_S} ))
while [ "$(date +%s)" -lt "$end" ]; do
  info=$(redis-cli --user "$ADMIN_USER" -p 6379 info replication) || exit 0
  case "$info" in *role:master*) ;; *) exit 0 ;; esac
  case "$info" in *connected_slaves:0*) exit 0 ;; esac
  sleep 0.1
done
"""


def service_user_rules(spec: TopicSpec) -> list[str]:
    """The ACL rules of the topic's delay-service user (the engine's, for this topic)."""
    topic = Topic(spec.name, namespace=spec.namespace, slot_amount=spec.slot_amount)
    stream_key = delivery_stream_key(spec) if spec.topic_type is TopicType.STREAM else ""
    return acl.service_user_rules(topic, stream_key)


def _stream_reader_env(spec: TopicSpec) -> list[Manifest]:
    """The reader user of the start script: its name, its rules, its password (from the
    Secret the consumers mount, so both always hold the same one)."""
    return [
        {"name": "STREAM_READER_USER", "value": acl.STREAM_READER_USER},
        {
            "name": "STREAM_READER_RULES",
            "value": " ".join(acl.stream_reader_rules(delivery_stream_key(spec))),
        },
        env_from_secret(
            "STREAM_READER_PASSWORD",
            naming.stream_reader_secret(spec.name),
            naming.SECRET_STREAM_READER_PASSWORD,
        ),
    ]


def _backup_user_env(spec: TopicSpec) -> list[Manifest]:
    """The backups' read-only user of the start script (every broker: a backup reads all)."""
    topic = Topic(spec.name, namespace=spec.namespace, slot_amount=spec.slot_amount)
    return [
        {"name": "BACKUP_USER", "value": acl.BACKUP_USER},
        {"name": "BACKUP_USER_RULES", "value": " ".join(acl.backup_user_rules(topic))},
        env_from_secret(
            "BACKUP_PASSWORD", naming.credentials_secret(spec.name), naming.SECRET_BACKUP_PASSWORD
        ),
    ]


def stream_reader_secret(spec: TopicSpec, credentials: Credentials) -> Manifest:
    """The stream consumers' login to broker 0's master Service: user, password and the whole
    `redis://` URL, for the tenant's consumer pods to mount. Its values are kept (apply.py) and
    hold nothing the spec can change: the stream key is the topic's `streamKey`."""
    host = naming.redis_master_host(spec.name, spec.namespace, 0)
    password = credentials.stream_reader_password
    url = (
        f"redis://{acl.STREAM_READER_USER}:{quote(password, safe='')}@{host}:{naming.REDIS_PORT}/0"
    )
    values = {
        naming.SECRET_STREAM_READER_USERNAME: acl.STREAM_READER_USER,
        naming.SECRET_STREAM_READER_PASSWORD: password,
        naming.SECRET_STREAM_READER_URL: url,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(
            naming.stream_reader_secret(spec.name),
            spec.namespace,
            naming.topic_labels(spec.name, naming.COMPONENT_REDIS),
        ),
        "data": {key: secret_value(value) for key, value in values.items()},
    }


def stream_reader_network_policy(spec: TopicSpec) -> Manifest:
    """The tenant's `networkPolicy.allowFrom` peers admitted to broker 0's Redis port, where
    the target stream is. Rendered with no rule when the list is empty (an ingress rule without
    `from` would admit every pod), so a peer removed from the spec is removed here too."""
    peers = list(spec.network_policy_allow_from)
    ingress = (
        [{"from": peers, "ports": [{"protocol": "TCP", "port": naming.REDIS_PORT}]}]
        if peers
        else []
    )
    rules: Manifest = {
        "podSelector": {"matchLabels": naming.redis_selector(spec.name, 0)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    return hashed_network_policy(
        naming.stream_reader_network_policy(spec.name),
        spec.namespace,
        naming.topic_labels(spec.name, naming.COMPONENT_REDIS),
        rules,
    )


def redis_labels(spec: TopicSpec, broker: int) -> dict[str, str]:
    return {
        **naming.topic_labels(spec.name, naming.COMPONENT_REDIS),
        naming.LABEL_BROKER: str(broker),
    }


def redis_maxmemory(limits: Mapping[str, str]) -> int:
    """maxmemory in bytes for a Redis container with these limits: MAXMEMORY_PERCENT of the
    memory limit, 0 (unbounded) when there is none. A limit that is not a quantity is left to
    the API server, which refuses the StatefulSet naming it; here it means no bound."""
    limit = limits.get("memory")
    if limit is None:
        return 0
    try:
        limit_bytes = memory_bytes(limit)
    except ValueError:
        return 0
    return max(1, limit_bytes * MAXMEMORY_PERCENT // 100) if limit_bytes > 0 else 0


def redis_statefulset(spec: TopicSpec, broker: int, ctx: BuildContext) -> Manifest:
    """Master + replicasPerBroker replicas of one broker; the PVCs follow deletionPolicy."""
    name = naming.redis_statefulset(spec.name, broker)
    labels = redis_labels(spec, broker)
    tmp, tmp_mount = tmp_volume()
    secret = naming.credentials_secret(spec.name)
    master_host = naming.redis_master_host(spec.name, spec.namespace, broker)
    volume_claim: Manifest = {
        "metadata": {"name": "data", "labels": dict(labels)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": spec.persistence_size}},
        },
    }
    if spec.persistence_storage_class:
        volume_claim["spec"]["storageClassName"] = spec.persistence_storage_class
    container_resources = resources(
        spec.redis_resources, REDIS_DEFAULT_REQUESTS, REDIS_DEFAULT_LIMITS
    )
    container: Manifest = {
        "name": "redis",
        "image": ctx.redis_image,
        "imagePullPolicy": ctx.image_pull_policy,
        "command": ["sh", "-c", REDIS_START_SCRIPT],
        "env": [
            env_from_field("POD_IP", "status.podIP"),
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_UID", "metadata.uid"),
            {"name": "MASTER_HOST", "value": master_host},
            master_pod_env(spec, broker),
            {"name": "MIN_REPLICAS_TO_WRITE", "value": str(spec.redis_min_replicas_to_write)},
            {
                "name": "MIN_REPLICAS_MAX_LAG_S",
                "value": str(spec.redis_min_replicas_max_lag_seconds),
            },
            {"name": "APPEND_FSYNC", "value": spec.redis_append_fsync},
            {"name": "MAXMEMORY", "value": str(redis_maxmemory(container_resources["limits"]))},
            {"name": "ADMIN_USER", "value": acl.ADMIN_USER},
            {"name": "ADMIN_USER_RULES", "value": " ".join(acl.ADMIN_RULES)},
            {"name": "SERVICE_USER", "value": acl.SERVICE_USER},
            {"name": "SERVICE_USER_RULES", "value": " ".join(service_user_rules(spec))},
            env_from_secret("REDIS_PASSWORD", secret, naming.SECRET_REDIS_PASSWORD),
            env_from_secret("REDIS_ADMIN_PASSWORD", secret, naming.SECRET_REDIS_ADMIN_PASSWORD),
            env_from_secret("REDISCLI_AUTH", secret, naming.SECRET_REDIS_PASSWORD),
            *(_stream_reader_env(spec) if broker == 0 and has_stream_reader(spec) else []),
            *(_backup_user_env(spec) if spec.backup is not None else []),
        ],
        "ports": [{"name": "redis", "containerPort": naming.REDIS_PORT}],
        "readinessProbe": {
            "exec": {
                "command": [
                    "redis-cli",
                    "--user",
                    acl.SERVICE_USER,
                    "-p",
                    str(naming.REDIS_PORT),
                    "ping",
                ]
            },
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "tcpSocket": {"port": naming.REDIS_PORT},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", REDIS_PRESTOP_SCRIPT]}}},
        "resources": container_resources,
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            tmp_mount,
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(name, spec.namespace, labels),
        "spec": {
            "serviceName": naming.redis_headless_service(spec.name, broker),
            "replicas": spec.redis_pods_per_broker,
            "podManagementPolicy": "Parallel",
            # the operator rolls the pods itself, one at a time (kube/rolling.py)
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": naming.redis_selector(spec.name, broker)},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": spec.deletion_policy,
                "whenScaled": "Retain",
            },
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "securityContext": pod_security_context(REDIS_UID),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": REDIS_TERMINATION_GRACE_S,
                    "affinity": redis_affinity(spec, broker),
                    **ctx.placement.pod_spec_fields(),
                    "containers": [container],
                    "volumes": [tmp],
                },
            },
            "volumeClaimTemplates": [volume_claim],
        },
    }


def redis_affinity(spec: TopicSpec, broker: int) -> Manifest:
    """Next to delay-service pod `broker` (which works this broker's slots), apart from each other.

    The pairing is written on the Redis side because the service pods share one template and
    cannot name their broker; a Redis StatefulSet exists per broker and can name its service pod
    by the pod-name label. The service StatefulSet is applied first (builders/bundle.py), and a
    new broker's StatefulSet is created once its service pod is placed (kube/pairing.py): a
    preference matches only pods already bound to a node.
    """
    service_pod = {
        **naming.service_selector(spec.name),
        POD_NAME_LABEL: f"{naming.service_statefulset(spec.name)}-{broker}",
    }
    return {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                preferred_term(SERVICE_PAIR_WEIGHT, service_pod, HOSTNAME_TOPOLOGY)
            ]
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                preferred_term(
                    BROKER_SPREAD_WEIGHT,
                    naming.redis_selector(spec.name, broker),
                    HOSTNAME_TOPOLOGY,
                )
            ]
        },
    }


def redis_headless_service(spec: TopicSpec, broker: int) -> Manifest:
    """Stable DNS per Redis pod (replication, the operator's probes)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            naming.redis_headless_service(spec.name, broker),
            spec.namespace,
            redis_labels(spec, broker),
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": naming.redis_selector(spec.name, broker),
            "ports": [{"name": "redis", "port": naming.REDIS_PORT, "targetPort": "redis"}],
        },
    }


def master_pod_env(spec: TopicSpec, broker: int) -> Manifest:
    """MASTER_POD: the broker's master as the operator recorded it when the container starts
    (optional: a fresh topic has none yet, and every pod starts as a replica)."""
    return {
        "name": "MASTER_POD",
        "valueFrom": {
            "configMapKeyRef": {
                "name": naming.redis_masters_config_map(spec.name),
                "key": naming.master_key(broker),
                "optional": True,
            }
        },
    }


def redis_master_service(spec: TopicSpec, broker: int) -> Manifest:
    """Always the current master, without a selector: its one endpoint is the EndpointSlice
    the operator writes (master_endpoint_slice), so failover moves no pod label."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            naming.redis_master_service(spec.name, broker),
            spec.namespace,
            redis_labels(spec, broker),
        ),
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "redis", "port": naming.REDIS_PORT, "targetPort": "redis"}],
        },
    }


def master_endpoint_slice(
    spec: TopicSpec, broker: int, pod: str, address: str | None, ready: bool
) -> Manifest:
    """The master Service's one endpoint: the named master pod at its current IP (none while
    it has no IP), ready as the pod is, as the slice controller would write it for a
    selector. addressType (immutable) follows the pod IP's family; without an IP it is left
    out: such a manifest can only empty an existing slice (master_endpoint.publish_master)."""
    service = naming.redis_master_service(spec.name, broker)
    labels = {
        **redis_labels(spec, broker),
        naming.LABEL_SERVICE_NAME: service,
        naming.LABEL_SLICE_MANAGED_BY: naming.SLICE_MANAGER,
    }
    endpoints = []
    if address:
        endpoints.append(
            {
                "addresses": [address],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "namespace": spec.namespace, "name": pod},
            }
        )
    manifest: Manifest = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata(service, spec.namespace, labels),
        "endpoints": endpoints,
        "ports": [{"name": "redis", "port": naming.REDIS_PORT, "protocol": "TCP"}],
    }
    if address:
        manifest["addressType"] = "IPv6" if ":" in address else "IPv4"
    return manifest


def masters_config_map(spec: TopicSpec, broker: int, record: str) -> Manifest:
    """The record of broker `broker`'s master (naming.redis_masters_config_map, the value
    naming.master_record): a patch of it sets that broker's key only."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            naming.redis_masters_config_map(spec.name),
            spec.namespace,
            naming.topic_labels(spec.name, naming.COMPONENT_REDIS),
        ),
        "data": {naming.master_key(broker): record},
    }


def redis_pdb(spec: TopicSpec, broker: int) -> Manifest:
    """Voluntary disruptions (drains) take at most one pod of a broker at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(
            naming.redis_statefulset(spec.name, broker),
            spec.namespace,
            redis_labels(spec, broker),
        ),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.redis_selector(spec.name, broker)},
        },
    }


def redis_network_policy(spec: TopicSpec, ctx: BuildContext) -> Manifest:
    """Only the topic's delay-service pods, its own Redis pods (replication), its scheduled
    backups' pods (read rights of the service user) and the operator."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(
            naming.redis_network_policy(spec.name),
            spec.namespace,
            naming.topic_labels(spec.name, naming.COMPONENT_REDIS),
        ),
        "spec": {
            "podSelector": {"matchLabels": naming.redis_selector(spec.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": naming.service_selector(spec.name)}},
                        {"podSelector": {"matchLabels": naming.redis_selector(spec.name)}},
                        {"podSelector": {"matchLabels": naming.backup_selector(spec.name)}},
                        operator_peer(ctx),
                    ],
                    "ports": [{"protocol": "TCP", "port": naming.REDIS_PORT}],
                }
            ],
        },
    }
