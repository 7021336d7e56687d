"""The CronJob of a topic's scheduled backups (spec.backup) (pure).

Each run is `delayq pipeline backup` in the platform's pipeline image, Spark in the pod
(`local[2]`): the topic's `topic.json` (its ConfigMap) says where the routing is; the brokers
are read as the topic's read-only backup user (`delayq-backup`, on every broker while
spec.backup is set, its password generated into the topic's Secret); the ZooKeeper password is
the topic's own (ZooKeeper has no read-only identity per topic: docs/security.md); the
tenant's PersistentVolumeClaim `backup.volumeClaim` receives one new directory per run under
`/backups/<topic>`, the oldest beyond `backup.keep` deleted by the run itself
(pipeline/retention.py). The tenant chooses when and onto which of
its own claims; the image, the command and the credentials are the operator's.
"""

from __future__ import annotations

from delayq.kube import naming
from delayq.kube.builders.common import (
    BuildContext,
    Manifest,
    container_security_context,
    env_from_secret,
    metadata,
    pod_security_context,
)
from delayq.kube.spec import BackupSchedule, TopicSpec
from delayq.queue import acl

PIPELINE_UID = 10001  # the pipeline image's user (examples/pipeline/Dockerfile)
BACKUP_MOUNT = "/backups"
SPARK_MASTER = "local[2]"
# Spark spills and stages under /tmp: a disk-backed emptyDir, not the services' small tmpfs
SPARK_TMP_LIMIT = "8Gi"
RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
# a run that started later than this after its time is skipped (the next one comes)
STARTING_DEADLINE_S = 600
RETRIES = 2  # a failed run leaves no complete backup behind: running it again is harmless


def backup_directory(spec: TopicSpec) -> str:
    """Where the runs write, one new directory each: a claim may hold several topics'."""
    return f"{BACKUP_MOUNT}/{spec.name}"


def broker_urls(spec: TopicSpec) -> str:
    """Every broker's master, logged in as the read-only backup user: the password comes from
    the pod's BACKUP_PASSWORD (the kubelet expands `$(...)`; a generated password is
    URL-safe), so it is in no manifest and no process list."""
    return ",".join(
        f"redis://{acl.BACKUP_USER}:$(BACKUP_PASSWORD)@"
        f"{naming.redis_master_host(spec.name, spec.namespace, broker)}:{naming.REDIS_PORT}/0"
        for broker in range(spec.brokers)
    )


def backup_cron_job(spec: TopicSpec, backup: BackupSchedule, ctx: BuildContext) -> Manifest:
    labels = naming.topic_labels(spec.name, naming.COMPONENT_BACKUP)
    secret = naming.credentials_secret(spec.name)
    container: Manifest = {
        "name": "backup",
        "image": ctx.pipeline_image,
        "imagePullPolicy": ctx.image_pull_policy,
        "command": ["delayq"],
        "args": [
            "pipeline",
            "backup",
            "--config",
            f"{naming.CONFIG_MOUNT}/{naming.CONFIG_KEY}",
            "--master",
            SPARK_MASTER,
            "--into",
            backup_directory(spec),
            "--keep",
            str(spec.backup_keep),
        ],
        # the kubelet reads the Secret: the operator needs no access, and no value is here
        "env": [
            env_from_secret("BACKUP_PASSWORD", secret, naming.SECRET_BACKUP_PASSWORD),
            {"name": "DELAYQ_BROKER_URLS", "value": broker_urls(spec)},
            env_from_secret("DELAYQ_ZOOKEEPER_PASSWORD", secret, naming.SECRET_ZOOKEEPER_PASSWORD),
        ],
        "resources": {side: dict(values) for side, values in RESOURCES.items()},
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": naming.CONFIG_MOUNT, "readOnly": True},
            {"name": "backups", "mountPath": BACKUP_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod: Manifest = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": pod_security_context(PIPELINE_UID),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            **ctx.placement.pod_spec_fields(),
            "containers": [container],
            "volumes": [
                {"name": "config", "configMap": {"name": naming.config_map(spec.name)}},
                {
                    "name": "backups",
                    "persistentVolumeClaim": {"claimName": backup.volume_claim},
                },
                {"name": "tmp", "emptyDir": {"sizeLimit": SPARK_TMP_LIMIT}},
            ],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": metadata(naming.backup_cron_job(spec.name), spec.namespace, labels),
        "spec": {
            "schedule": backup.schedule,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": STARTING_DEADLINE_S,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": dict(labels)},
                "spec": {"backoffLimit": RETRIES, "template": pod},
            },
        },
    }
