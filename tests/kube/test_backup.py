"""spec.backup: the operator's scheduled backups, from the tenant's field to the CronJob.

The CronJob runs the platform's pipeline image with the topic's own read credentials onto the
tenant's claim; every field the tenant writes is hostile input (a schedule Kubernetes and the
operator would read differently, a claim name that is a path, a count out of range). The
reconcile writes and retires the CronJob against kmock; the status comes from its report.
"""

from __future__ import annotations

import logging
from typing import Any

import kmock
import pytest

from delayq.kube import naming
from delayq.kube.backups import BackupResult, backup_status, observe_backups
from delayq.kube.builders.backup import backup_cron_job
from delayq.kube.builders.bundle import build_all, build_retired
from delayq.kube.builders.common import BuildContext, Credentials
from delayq.kube.builders.redis import redis_network_policy
from delayq.kube.client import KubeClient
from delayq.kube.context import OperatorContext
from delayq.kube.spec import SpecError, TopicSpec, parse_spec
from delayq.kube.zookeeper_clients import clients_ingress
from delayq.queue import acl
from tests.kube.pods import NAMESPACE
from tests.kube.test_handlers import body, get, provision, put_topic, update_spec

CRONJOBS = "batch/v1/cronjobs"
BACKUP = {"schedule": "15 3 * * *", "volumeClaim": "orders-backups", "keep": 3}
CTX = BuildContext(pipeline_image="registry.example/delayq-pipeline@sha256:" + "a" * 64)
CREDENTIALS = Credentials(*(f"secret-value-{n}" for n in range(8)))


def spec_with(backup: dict[str, Any] | None) -> TopicSpec:
    return parse_spec("orders", NAMESPACE, {} if backup is None else {"backup": backup})


def test_the_cron_job_runs_the_platforms_image_with_the_topics_read_credentials() -> None:
    spec = spec_with(BACKUP)
    assert spec.backup is not None
    job = backup_cron_job(spec, spec.backup, CTX)
    assert job["metadata"]["name"] == "orders-backup"
    cron = job["spec"]
    assert (cron["schedule"], cron["timeZone"], cron["concurrencyPolicy"]) == (
        "15 3 * * *",
        "Etc/UTC",
        "Forbid",  # one run at a time: retention never races a running backup
    )
    pod = cron["jobTemplate"]["spec"]["template"]
    assert pod["metadata"]["labels"][naming.LABEL_COMPONENT] == naming.COMPONENT_BACKUP
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    assert container["image"] == CTX.pipeline_image  # the platform's, never the tenant's
    assert container["args"] == [
        "pipeline",
        "backup",
        "--config",
        "/etc/delayq/topic.json",
        "--master",
        "local[2]",
        "--into",
        "/backups/orders",
        "--keep",
        "3",
    ]
    # the brokers as the read-only backup user, its password from the topic's own Secret
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env == {
        "BACKUP_PASSWORD": {"name": "orders-credentials", "key": "backup-password"},
        "DELAYQ_BROKER_URLS": "redis://delayq-backup:$(BACKUP_PASSWORD)@"
        "orders-redis-0.shop.svc:6379/0",
        "DELAYQ_ZOOKEEPER_PASSWORD": {"name": "orders-credentials", "key": "zookeeper-password"},
    }
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["backups"]["persistentVolumeClaim"] == {"claimName": "orders-backups"}
    assert volumes["config"]["configMap"] == {"name": "orders-config"}


def test_the_topic_owns_a_cron_job_only_while_it_asks_for_backups() -> None:
    with_backup = build_all(spec_with(BACKUP), CTX, CREDENTIALS, 16, False)
    assert with_backup[-1]["kind"] == "CronJob"  # after the StatefulSets: same namespace rights
    assert "secret-value" not in str(with_backup[-1])
    without = build_all(spec_with(None), CTX, CREDENTIALS, 16, False)
    assert all(manifest["kind"] != "CronJob" for manifest in without)
    retired = [(ref["kind"], ref["metadata"]["name"]) for ref in build_retired(spec_with(None))]
    assert ("CronJob", "orders-backup") in retired
    assert ("CronJob", "orders-backup") not in [
        (ref["kind"], ref["metadata"]["name"]) for ref in build_retired(spec_with(BACKUP))
    ]


def test_every_broker_has_the_read_only_backup_user_only_with_spec_backup() -> None:
    def users(spec: TopicSpec) -> list[dict[str, Any]]:
        manifests = build_all(spec, CTX, CREDENTIALS, 16, False)
        containers = [
            m["spec"]["template"]["spec"]["containers"][0]
            for m in manifests
            if m["kind"] == "StatefulSet" and "-redis-" in m["metadata"]["name"]
        ]
        assert len(containers) == spec.brokers
        return [{e["name"]: e.get("value") for e in c["env"]} for c in containers]

    two = parse_spec("orders", NAMESPACE, {"backup": BACKUP, "brokers": 2})
    for env in users(two):
        assert env["BACKUP_USER"] == acl.BACKUP_USER
        rules = env["BACKUP_USER_RULES"].split()
        assert "-@all" in rules
        assert not {"+fcall", "+set", "+del", "+eval"} & set(rules)  # reads only
    assert all("BACKUP_USER" not in env for env in users(spec_with(None)))


def test_backup_pods_reach_their_own_redis_and_zookeeper_only_as_backup_pods() -> None:
    policy = redis_network_policy(spec_with(BACKUP), CTX)
    peers = policy["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": naming.backup_selector("orders")}} in peers
    (rule,) = clients_ingress(["shop"])
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}
    (expression,) = peer["podSelector"]["matchExpressions"]
    assert expression["values"] == [naming.COMPONENT_BACKUP, naming.COMPONENT_SERVICE]


@pytest.mark.parametrize(
    ("backup", "named"),
    [
        ({"schedule": "0 3 * * *\n", "volumeClaim": "b"}, "backup.schedule"),  # a second line
        ({"schedule": "TZ=Asia/Tokyo 0 3 * * *", "volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": "CRON_TZ=UTC 0 3 * * *", "volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": "0 3 L * *", "volumeClaim": "b"}, "backup.schedule"),  # cronsim-only
        ({"schedule": "@every 1s", "volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": "0 0 30 2 *", "volumeClaim": "b"}, "backup.schedule"),  # never fires
        ({"schedule": "* " * 60 + "*", "volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": 5, "volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": "0 3 * * *", "volumeClaim": "../etc"}, "backup.volumeClaim"),
        ({"schedule": "0 3 * * *", "volumeClaim": "Claim"}, "backup.volumeClaim"),
        ({"schedule": "0 3 * * *", "volumeClaim": "a" * 254}, "backup.volumeClaim"),
        ({"schedule": "0 3 * * *"}, "backup.volumeClaim"),
        ({"volumeClaim": "b"}, "backup.schedule"),
        ({"schedule": "0 3 * * *", "volumeClaim": "b", "keep": 0}, "backup.keep"),
        ({"schedule": "0 3 * * *", "volumeClaim": "b", "keep": 10**9}, "backup.keep"),
    ],
)
def test_a_hostile_backup_field_is_refused_naming_it(backup: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError, match=named.replace(".", r"\.")):
        spec_with(backup)


@pytest.mark.parametrize("schedule", ["*/30 * * * *", "0 3 * * MON-FRI", "0 0 1 jan *", "@daily"])
def test_schedules_kubernetes_reads_alike_are_taken(schedule: str) -> None:
    spec = spec_with({"schedule": schedule, "volumeClaim": "b"})
    assert spec.backup is not None
    assert spec.backup.schedule == schedule


@pytest.mark.parametrize(
    ("report", "result"),
    [
        ({}, BackupResult.NEVER),
        ({"lastScheduleTime": "2026-11-29T03:15:00Z"}, BackupResult.FAILED),
        (
            {"lastScheduleTime": "2026-11-29T03:15:00Z", "active": [{"name": "orders-backup-1"}]},
            BackupResult.RUNNING,
        ),
        (
            {
                "lastScheduleTime": "2026-11-29T03:15:00Z",
                "lastSuccessfulTime": "2026-11-29T03:16:05Z",
            },
            BackupResult.SUCCEEDED,
        ),
        (  # a run made by hand (kubectl create job --from=cronjob/...): never scheduled
            {"lastSuccessfulTime": "2026-11-29T10:02:11Z"},
            BackupResult.SUCCEEDED,
        ),
        (  # the last success is of the run before: the last scheduled one failed
            {
                "lastScheduleTime": "2026-11-29T03:15:00Z",
                "lastSuccessfulTime": "2026-11-28T03:16:05Z",
            },
            BackupResult.FAILED,
        ),
    ],
)
def test_the_status_says_how_the_last_run_ended(
    report: dict[str, Any], result: BackupResult
) -> None:
    status = backup_status(spec_with(BACKUP), {"status": report})
    assert status["lastResult"] == result.value
    assert status["cronJob"] == "orders-backup"
    assert status.get("lastSuccessfulTime") == report.get("lastSuccessfulTime")


async def test_reconcile_writes_the_cron_job_and_removes_it_with_spec_backup(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    kube: KubeClient,
    logger: logging.Logger,
) -> None:
    put_topic(api, backup=BACKUP)
    await provision(api, ctx, logger)
    cron_job = get(api, CRONJOBS, "orders-backup")
    assert cron_job is not None
    assert cron_job["spec"]["schedule"] == "15 3 * * *"
    assert cron_job["metadata"]["ownerReferences"][0]["uid"] == "uid-orders"
    spec = parse_spec("orders", NAMESPACE, body(api)["spec"])
    assert (await observe_backups(kube, spec)) == {
        "cronJob": "orders-backup",
        "schedule": "15 3 * * *",
        "volumeClaim": "orders-backups",
        "lastResult": BackupResult.NEVER.value,
    }

    update_spec(api, backup={**BACKUP, "schedule": "0 4 * * *"})
    await provision(api, ctx, logger)
    cron_job = get(api, CRONJOBS, "orders-backup")
    assert cron_job is not None
    assert cron_job["spec"]["schedule"] == "0 4 * * *"

    api.objects[CRONJOBS, NAMESPACE, "orders-backup"].patch(
        {"metadata": {"ownerReferences": []}}
    )  # a CronJob of that name the tenant made itself: never the operator's to delete
    update_spec(api, backup=None)
    await provision(api, ctx, logger)
    assert get(api, CRONJOBS, "orders-backup") is not None
    api.objects[CRONJOBS, NAMESPACE, "orders-backup"].patch(
        {"metadata": {"ownerReferences": [{"uid": "uid-orders"}]}}
    )
    await provision(api, ctx, logger)
    assert get(api, CRONJOBS, "orders-backup") is None
    spec = parse_spec("orders", NAMESPACE, body(api)["spec"])
    assert await observe_backups(kube, spec) is None
