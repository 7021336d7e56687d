"""The DR drill on real pods (issue 32): a webhook topic on the real node loses every pod and
every volume of its brokers, and is recovered from a backup plus the journal archive.

While messages wait and a producer keeps scheduling, the journal is archived and the topic
backed up (`delayq pipeline archive`; the backup is the topic's scheduled one, spec.backup, run
now as a Job made from its CronJob, delivery going on); after the snapshot some of its messages
are delivered, cancelled or rescheduled and new ones scheduled, and the journal is archived
again. Then every pod of the topic and every claim and volume of its brokers is deleted (the
volumes' directories emptied), the operator makes the brokers again, and the topic is restored
with the replay of the archive (`delayq pipeline restore --replay`), paused meanwhile. A
counting checker then holds what the drill promises: every message pending at the snapshot
delivered, none early, each duplicate delivered again because its first delivery came after the
last archive run (the recovery point); the replay's figures exactly what the receiver and the
test's own calls tell.

The backup runs as the operator made it: the CronJob's Job, in the pipeline image
(examples/pipeline/Dockerfile, built by e2e/images.sh) on the real kubelet, as the read-only
backup user, onto the tenant's claim; the test reads the snapshot from that volume's host
directory and checks that status.backup reports it. The archive and the restore run on this
machine, with the checkout's code and this interpreter's pyspark, inside the real node's network
namespace: there pod addresses and Service ClusterIPs route as on a node (kube-proxy's rules),
with no change to the host's network.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest

from delayq.kube import naming
from delayq.kube.builders.backup import BACKUP_MOUNT
from delayq.queue import acl
from e2e import workloads
from e2e.harness import deliveries
from e2e.harness.kube import Kube, condition
from e2e.harness.metrics import samples
from e2e.harness.node import RealNode
from e2e.harness.process import REPO
from e2e.harness.real_release import SERVICE_CIDR, Install, install_release
from e2e.harness.topics import delay_topic, topic_secret
from e2e.test_real_pods import (
    HTTP_GET,
    SERVICE_PORT,
    _explain,
    _in_pod,
    _pods,
    _ready,
    _wait_pods_ready,
    _wait_topic_ready,
)

RELEASE = "dr"
FULLNAME = "dr-delayq"
TOPIC = "hooks"
BROKERS = 2
SLOTS = 16
TOPIC_PODS = 2 * BROKERS  # a Redis pod (no replica) and a delay-service pod per broker
#: The tenant's claim spec.backup writes to, and a schedule that never comes during the test
#: (1 January): the drill runs the backup itself, as a Job made from the CronJob.
BACKUP_CLAIM, BACKUP_SCHEDULE = "backups", "0 0 1 1 *"
BACKUP_JOB = "backup-drill"

#: Pending at the snapshot: due 25..135 s after they are stored, so that some are delivered
#: before the snapshot, some between it and the loss, some during the outage and some after.
PENDING, PENDING_START_MS, PENDING_SPREAD_MS = 300, 25_000, 110_000
#: Arriving through the backup: 10 a second for 20 s, each due 2..6 s later.
STEADY, STEADY_PER_SECOND = 200, 10
#: Scheduled after the snapshot, due after the loss: the journal carries no payload, so these
#: are what a restore cannot bring back (the replay reports them).
AFTER, AFTER_START_MS, AFTER_SPREAD_MS = 50, 60_000, 10_000
#: Of the backup's messages, changed after the snapshot through the API: the latest-due pending
#: ones (due long after the loss), cancelled and rescheduled.
CANCELLED = [f"pending-{i}" for i in range(PENDING - 20, PENDING - 10)]
RESCHEDULED = [f"pending-{i}" for i in range(PENDING - 10, PENDING)]
RESCHEDULE_DELAY_MS = 60_000
#: A delivery logged by the receiver is acked by the topic within its round trip: a first
#: delivery this much before the last archive run began may still have been acked after it.
ACK_ROUND_TRIP_MS = 1_000

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def pipeline_imported(real_node: RealNode) -> Iterator[Future[None]]:
    """The pipeline image's import into the node (1.5 GB: a minute at load), begun before the
    release is installed, in a thread: only the backup Job waits for it."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(real_node.import_image, "pipeline")


@pytest.fixture(scope="module")
def drill(kube: Kube, real_node: RealNode) -> Iterator[Install]:
    """A release of the chart on the real node and a webhook topic of 2 brokers (no replica)
    with its journal on, delivering to a receiver Deployment."""
    installed = install_release(kube, real_node, RELEASE, "e2e-dr")
    namespace, tenant, image = installed.namespace, installed.tenant, installed.image
    try:
        kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": BACKUP_CLAIM, "namespace": tenant},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}, tenant)
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        kube.apply({"apiVersion": "v1", "kind": "List",
                    "items": workloads.receiver(tenant, image, secret)})
        url = f"http://receiver.{tenant}.svc.cluster.local/hook"
        signing = {"name": workloads.SIGNING_SECRET, "key": workloads.SIGNING_SECRET}
        kube.apply(delay_topic(TOPIC, slotAmount=SLOTS, brokers=BROKERS, replicasPerBroker=0,
                               topicType="webhook", journalMaxLen=100_000,
                               delivery={"webhook": {"url": url, "allowInsecureHttp": True,
                                                     "allowedCidrs": [SERVICE_CIDR],
                                                     "signingSecretRef": signing}},
                               backup={"schedule": BACKUP_SCHEDULE,
                                       "volumeClaim": BACKUP_CLAIM}), tenant)
        _wait_topic_ready(kube, tenant, TOPIC)
        _wait_pods_ready(kube, tenant, f"delayq.io/topic={TOPIC}", TOPIC_PODS)
        _wait_pods_ready(kube, tenant, "app=receiver", 1)
        yield installed
    finally:
        kube.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m",
                  timeout=240, check=False)
        for name in (tenant, namespace):
            kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _produce(kube: Kube, drill: Install, name: str, count: int, start_ms: int, spread_ms: int,
             per_second: float = 0) -> None:
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.producer(
        drill.tenant, drill.image, TOPIC, name, count, start_ms, spread_ms,
        per_second=per_second, batch=20 if per_second else 200)})


def _produced(kube: Kube, drill: Install, name: str, timeout_s: float = 180) -> int:
    """Waits for the producer Job ``name``; how many it stored."""
    try:
        kube.wait(lambda: (kube.get("job", name, drill.tenant) or {})
                  .get("status", {}).get("succeeded") == 1, timeout_s=timeout_s,
                  what=f"producer job {name} to finish")
    except TimeoutError:
        print(_explain(kube, drill.tenant, _pods(kube, drill.tenant, f"job-name={name}")))
        raise
    logs = kube.kubectl("logs", f"job/{name}", "-n", drill.tenant, "--tail=-1").stdout
    stored: int = workloads.json_lines(logs)[-1]["stored"]
    return stored


def _all_deliveries(kube: Kube, drill: Install) -> list[dict[str, Any]]:
    logs = kube.kubectl("logs", "deployment/receiver", "-n", drill.tenant, "--tail=-1",
                        timeout=120).stdout
    return [entry for entry in workloads.json_lines(logs) if "id" in entry]


#: Calls the topic's API from inside a delay-service pod (argv: topic, a JSON list of
#: [method, path, body]); prints [status, body] of each.
API_CALLS = """
import json, os, sys, urllib.error, urllib.request
topic, calls = sys.argv[1], json.loads(sys.argv[2])
headers = {"Authorization": "Bearer " + os.environ["DELAYQ_API_TOKEN"],
           "Content-Type": "application/json"}
answers = []
for method, path, body in calls:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:8080/v1/topics/{topic}{path}",
                                     data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answers.append([response.status, response.read().decode()])
    except urllib.error.HTTPError as error:
        answers.append([error.code, error.read().decode()])
print(json.dumps(answers))
"""


def _api(kube: Kube, drill: Install, calls: list[tuple[str, str, Any]]) -> list[tuple[int, str]]:
    """The topic's answers to ``calls`` (method, path under the topic, JSON body or None)."""
    out = _in_pod(kube, drill.tenant, f"{TOPIC}-service-0", API_CALLS, TOPIC,
                  json.dumps(calls), timeout=120)
    return [(status, body) for status, body in json.loads(out.strip().splitlines()[-1])]


def _still_stored(kube: Kube, drill: Install, ids: list[str]) -> list[str]:
    """Those of ``ids`` the topic still holds (GET answers 200: waiting or in flight)."""
    answers = _api(kube, drill, [("GET", f"/messages/{i}", None) for i in ids])
    return [i for i, (status, _) in zip(ids, answers, strict=True) if status == 200]


def _paused_everywhere(kube: Kube, drill: Install) -> bool:
    """Every delay-service process reports ``delayq_paused`` 1."""
    pods = _pods(kube, drill.tenant, f"delayq.io/topic={TOPIC},"
                 "app.kubernetes.io/component=delay-service")
    values = [[value for _, value in samples(_in_pod(
        kube, drill.tenant, pod["metadata"]["name"], HTTP_GET, str(SERVICE_PORT), "/metrics"),
        "delayq_paused")] for pod in pods]
    return len(pods) == BROKERS and all(found and set(found) == {1.0} for found in values)


@dataclass(frozen=True)
class Pipeline:
    """``delayq pipeline`` run on this machine inside the real node's network namespace,
    against the topic's brokers (their master Services' ClusterIPs) and ZooKeeper, with the
    topic's ``topic.json``: backup and restore as the topic's service user, archive as the
    operator's Redis user (it trims the journal: docs/pipeline.md)."""

    node: RealNode
    config: Path
    env: dict[str, str]
    zookeeper: str
    broker_urls: dict[str, str]  # Redis user -> every broker's URL, comma-separated

    def run(self, command: str, *args: str, user: str = acl.SERVICE_USER) -> dict[str, Any]:
        """The job's JSON summary; its stderr (the summary line) is printed."""
        argv = [*self.node.network.exec_prefix(), sys.executable, "-m", "delayq.cli",
                "pipeline", command, "--config", str(self.config),
                "--zookeeper-connect", self.zookeeper, *args]
        start = time.monotonic()
        env = {**self.env, "DELAYQ_BROKER_URLS": self.broker_urls[user]}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400,
                                check=False)
        lines = [line for line in result.stderr.splitlines()
                 if line.startswith(("archive:", "backup:", "restore:", "replay:"))]
        print(f"e2e: pipeline {command} ({time.monotonic() - start:.1f}s): "
              + " | ".join(lines[-3:]))
        assert result.returncode == 0, result.stderr[-4000:]
        summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return summary


def _scheduled_backup(kube: Kube, drill: Install,
                      imported: Future[None]) -> tuple[dict[str, Any], Path]:
    """The topic's scheduled backup, run now: a Job made from its CronJob (as `kubectl create
    job --from=cronjob/...`), on the real node in the pipeline image. Its JSON summary, and
    where its snapshot is on this machine (the backup claim's volume is a host directory)."""
    start = time.monotonic()
    imported.result()
    print(f"e2e: waited {time.monotonic() - start:.1f}s for the pipeline image's import")
    start = time.monotonic()
    kube.kubectl("create", "job", BACKUP_JOB, f"--from=cronjob/{naming.backup_cron_job(TOPIC)}",
                 "-n", drill.tenant)

    def finished() -> dict[str, Any] | None:
        status = (kube.get("job", BACKUP_JOB, drill.tenant) or {}).get("status", {})
        return status if status.get("succeeded") or status.get("failed") else None

    status = kube.wait(finished, timeout_s=300, what="the backup Job to finish")
    logs = kube.kubectl("logs", f"job/{BACKUP_JOB}", "-n", drill.tenant, "--tail=-1",
                        check=False).stdout
    assert status.get("succeeded") == 1, (status, logs[-4000:])
    summary: dict[str, Any] = workloads.json_lines(logs)[-1]
    pod = next(p for p in _pods(kube, drill.tenant, f"job-name={BACKUP_JOB}")
               if p["status"].get("phase") == "Succeeded")
    ran = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    at = {key: datetime.fromisoformat(value).timestamp() for key, value in (
        ("created", pod["metadata"]["creationTimestamp"]), ("started", ran["startedAt"]),
        ("finished", ran["finishedAt"]))}
    print(f"e2e: backup Job ({time.monotonic() - start:.1f}s: pod made to container start "
          f"{at['started'] - at['created']:.0f}s, container {at['finished'] - at['started']:.0f}s"
          f", the job {summary['seconds']:.1f}s): {summary['items']} into {summary['output']}")
    claim = kube.get("pvc", BACKUP_CLAIM, drill.tenant) or {}
    volume = kube.get("pv", claim["spec"]["volumeName"]) or {}
    on_host = Path(volume["spec"]["hostPath"]["path"])
    return summary, on_host / Path(summary["output"]).relative_to(BACKUP_MOUNT)


def _backup_status(kube: Kube, drill: Install) -> dict[str, Any] | None:
    """status.backup once it reports a completed run."""
    backup: dict[str, Any] = ((kube.get("dt", TOPIC, drill.tenant) or {}).get("status") or {}
                              ).get("backup") or {}
    return backup if backup.get("lastResult") == "Succeeded" else None


def _cluster_ip(kube: Kube, namespace: str, service: str) -> str:
    ip: str = (kube.get("service", service, namespace) or {})["spec"]["clusterIP"]
    return ip


def _pipeline(kube: Kube, drill: Install, real_node: RealNode, workdir: Path) -> Pipeline:
    config = workdir / "topic.json"
    config_map = kube.get("configmap", f"{TOPIC}-config", drill.tenant) or {}
    config.write_text(config_map["data"]["topic.json"])
    password = topic_secret(kube, drill.tenant, TOPIC, "redis-password")
    passwords = {acl.SERVICE_USER: password,
                 acl.ADMIN_USER: topic_secret(kube, drill.tenant, TOPIC, "redis-admin-password")}
    hosts = [_cluster_ip(kube, drill.tenant, f"{TOPIC}-redis-{b}") for b in range(BROKERS)]
    urls = {user: ",".join(f"redis://{user}:{quote(secret, safe='')}@{host}:6379/0"
                           for host in hosts) for user, secret in passwords.items()}
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(
               [str(REPO / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "DELAYQ_REDIS_PASSWORD": password,
           "DELAYQ_ZOOKEEPER_PASSWORD": topic_secret(kube, drill.tenant, TOPIC,
                                                     "zookeeper-password"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    zookeeper = f"{_cluster_ip(kube, drill.namespace, f'{FULLNAME}-zookeeper')}:2181"
    return Pipeline(real_node, config, env, zookeeper, urls)


def _backed_up(path: Path) -> dict[str, int]:
    """The waiting messages of a backup (``items``, read with pyarrow): id -> its slot's
    snapshot instant (``taken_ms``)."""
    table = pq.read_table(path / "items", columns=["kind", "id", "taken_ms"])
    return {row["id"]: row["taken_ms"] for row in table.to_pylist() if row["kind"] == "waiting"}


def _lose_every_broker_volume(kube: Kube, drill: Install) -> set[str]:
    """Total loss: the topic's claims, then every pod of the topic (killed at once, no
    grace), then the volumes those claims held, their directories emptied. Returns the lost
    claims' uids."""
    claims = kube.items("pvc", drill.tenant, f"delayq.io/topic={TOPIC}")
    assert len(claims) == BROKERS, [c["metadata"]["name"] for c in claims]
    volumes = [c["spec"]["volumeName"] for c in claims]
    kube.kubectl("delete", "pvc", *[c["metadata"]["name"] for c in claims], "-n", drill.tenant,
                 "--wait=false")
    kube.kubectl("delete", "pod", "-l", f"delayq.io/topic={TOPIC}", "-n", drill.tenant,
                 "--grace-period=0", "--force", "--wait=false")
    lost = {c["metadata"]["uid"] for c in claims}
    kube.wait(lambda: not lost & {c["metadata"]["uid"] for c in kube.items(
        "pvc", drill.tenant, f"delayq.io/topic={TOPIC}")}, timeout_s=120,
        what="the topic's claims deleted")
    for volume in volumes:
        directory = Path((kube.get("pv", volume) or {})["spec"]["hostPath"]["path"])
        kube.kubectl("delete", "pv", volume, "--wait=true", timeout=120)
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    return lost


def _recreated(kube: Kube, drill: Install, lost: set[str]) -> bool:
    """The topic Ready on new pods and new claims (the StatefulSets make a claim again for
    a pod that waits for one)."""
    claims = kube.items("pvc", drill.tenant, f"delayq.io/topic={TOPIC}")
    pods = _pods(kube, drill.tenant, f"delayq.io/topic={TOPIC}")
    fresh = len(claims) == BROKERS and all(
        c["metadata"]["uid"] not in lost and c["status"].get("phase") == "Bound" for c in claims)
    return (fresh and len(pods) == TOPIC_PODS and all(map(_ready, pods))
            and condition(kube.get("dt", TOPIC, drill.tenant), "Ready") == "True")


def _figures(lateness_ms: list[float]) -> str:
    """p50, p99 and max of an ascending list of lateness, in seconds."""
    if not lateness_ms:
        return "none"
    return (f"p50 {deliveries.percentile(lateness_ms, 0.5) / 1000:.1f} s, p99 "
            f"{deliveries.percentile(lateness_ms, 0.99) / 1000:.1f} s, max "
            f"{lateness_ms[-1] / 1000:.1f} s")


def test_a_topic_that_lost_every_pod_and_volume_is_restored_from_backup_and_journal(
    kube: Kube, real_node: RealNode, pipeline_imported: Future[None], drill: Install,
    tmp_path: Path
) -> None:
    """The drill, step by step (module docstring), and its checks: the backup lost nothing;
    after the restore every message pending at the snapshot is delivered (the cancelled ones
    never, the rescheduled ones at their new due), none early; a duplicate only where its first
    delivery came after the last archive run began; the replay finished exactly the backup's
    messages delivered before the loss and not delivered again plus the cancelled ones,
    rescheduled exactly the rescheduled ones, and reported exactly the messages scheduled after
    the snapshot that had not been delivered, none of which is delivered."""
    started = time.monotonic()
    pipeline = _pipeline(kube, drill, real_node, tmp_path)
    archive = ["--output", str(tmp_path / "journal"), "--checkpoint", str(tmp_path / "ckpt")]

    _produce(kube, drill, "pending", PENDING, PENDING_START_MS, PENDING_SPREAD_MS)
    assert _produced(kube, drill, "pending") == PENDING
    _produce(kube, drill, "steady", STEADY, 2_000, 4_000, per_second=STEADY_PER_SECOND)
    kube.wait(lambda: any(e["id"].startswith("steady-") for e in _all_deliveries(kube, drill)),
              timeout_s=120, what="the steady producer's messages delivered")
    pipeline.run("archive", *archive, user=acl.ADMIN_USER)
    backup_start_ms = time.time() * 1000
    backed_up, backup_dir = _scheduled_backup(kube, drill, pipeline_imported)
    backup_end_ms = time.time() * 1000
    snapshot = _backed_up(backup_dir)
    assert len(snapshot) == backed_up["items"]["waiting"]

    # after the snapshot: cancel and reschedule some of its messages, schedule new ones
    answers = _api(kube, drill, [("DELETE", f"/messages/{i}", None) for i in CANCELLED] + [
        ("POST", f"/messages/{i}/reschedule", {"delayMs": RESCHEDULE_DELAY_MS})
        for i in RESCHEDULED])
    assert all(status == 200 for status, _ in answers), answers
    new_due = {i: json.loads(body)["dueMs"]
               for i, (_, body) in zip(RESCHEDULED, answers[len(CANCELLED):], strict=True)}
    assert set(CANCELLED + RESCHEDULED) <= snapshot.keys()
    assert _produced(kube, drill, "steady", timeout_s=240) == STEADY
    _produce(kube, drill, "after", AFTER, AFTER_START_MS, AFTER_SPREAD_MS)
    assert _produced(kube, drill, "after") == AFTER
    # the CronJob controller records the Job's success, the operator's health pass reports it
    reported = kube.wait(lambda: _backup_status(kube, drill), timeout_s=60,
                         what="status.backup to report the backup")
    assert reported["cronJob"] == naming.backup_cron_job(TOPIC), reported
    assert reported["volumeClaim"] == BACKUP_CLAIM, reported
    assert reported["lastSuccessfulTime"], reported
    # every steady message the snapshot missed is finished (acked) before the archive reads
    # the journal: the replay must then report only the `after` ones as scheduled after it
    steady_after = [f"steady-{i}" for i in range(STEADY) if f"steady-{i}" not in snapshot]
    kube.wait(lambda: not _still_stored(kube, drill, steady_after), timeout_s=60,
              what="the steady messages scheduled after the snapshot delivered")
    archive_start_ms = time.time() * 1000
    pipeline.run("archive", *archive, user=acl.ADMIN_USER)

    loss_ms = time.time() * 1000
    lost = _lose_every_broker_volume(kube, drill)
    try:
        kube.wait(lambda: _recreated(kube, drill, lost), timeout_s=240,
                  what="the topic Ready on new pods and new volumes")
    except TimeoutError:
        print(_explain(kube, drill.tenant, _pods(kube, drill.tenant, f"delayq.io/topic={TOPIC}")))
        print(kube.kubectl("get", "dt,pvc,pods", "-n", drill.tenant, "-o", "wide",
                           check=False).stdout)
        raise
    recovered_ms = time.time() * 1000
    print(f"e2e: brokers made again on new volumes {(recovered_ms - loss_ms) / 1000:.1f}s "
          f"after the loss")

    # paused while restoring: an overdue message the replay will cancel (delivered after the
    # snapshot) must not be delivered between its restore and the replay
    assert _api(kube, drill, [("POST", "/pause", None)])[0][0] == 200
    kube.wait(lambda: _paused_everywhere(kube, drill), timeout_s=30,
              what="every delay-service process paused")
    restore_start_ms = time.time() * 1000
    restored = pipeline.run("restore", "--input", str(backup_dir), "--replay",
                            str(tmp_path / "journal"))
    assert _api(kube, drill, [("POST", "/resume", None)])[0][0] == 200
    resumed_ms = time.time() * 1000

    produced = ([f"pending-{i}" for i in range(PENDING)] + [f"steady-{i}" for i in range(STEADY)]
                + [f"after-{i}" for i in range(AFTER)])
    after_ids = [f"after-{i}" for i in range(AFTER)]
    expected = sorted(set(produced) - set(CANCELLED) - set(after_ids))

    def all_delivered() -> deliveries.Count | None:
        found = deliveries.count(expected, _all_deliveries(kube, drill))
        return found if not found.lost else None

    try:
        kube.wait(all_delivered, timeout_s=240, what=f"{len(expected)} messages delivered")
    except TimeoutError:
        missing = deliveries.count(expected, _all_deliveries(kube, drill)).lost
        print(f"{len(missing)} not delivered, e.g. {missing[:10]}")
        raise
    log = _all_deliveries(kube, drill)
    result = deliveries.count(expected, log)
    first_ms: dict[str, float] = {}
    after_restore: set[str] = set()
    for entry in log:
        first_ms.setdefault(entry["id"], entry["atMs"])
        if entry["atMs"] >= restore_start_ms:
            after_restore.add(entry["id"])

    # the backup lost nothing: each pending message is in it or was delivered before it ended
    pending = [f"pending-{i}" for i in range(PENDING)]
    missed = [i for i in pending if i not in snapshot and first_ms.get(i, 1e20) > backup_end_ms]
    assert not missed, missed[:10]
    assert not result.early, result.early[:5]
    assert not set(CANCELLED) & first_ms.keys(), "a message cancelled after the snapshot"
    for message_id in RESCHEDULED:
        dues = {e["dueMs"] for e in log if e["id"] == message_id}
        assert dues == {new_due[message_id]}, (message_id, dues, new_due[message_id])
    delivered_after = sorted(set(after_ids) & first_ms.keys())
    # a duplicate is a counted redelivery (its attempts rise), or a message of the snapshot
    # first delivered after the last archive run began (its ack is not in the archive: the
    # recovery point), restored and delivered again
    unexplained = [i for i in result.unexplained if i not in snapshot or first_ms[i] <
                   archive_start_ms - ACK_ROUND_TRIP_MS or i not in after_restore]
    assert not unexplained, {i: result.duplicates[i] for i in unexplained[:5]}

    # the replay, exactly: what the receiver saw of the snapshot's messages before the restore
    replay = restored["replay"]
    changed = set(CANCELLED + RESCHEDULED)
    delivered_before = {i for i in snapshot if i not in changed and first_ms.get(
        i, 1e20) < restore_start_ms}
    again = {i for i in delivered_before if i in after_restore}
    assert replay["finished"] == len(delivered_before) - len(again) + len(CANCELLED), (
        replay, len(delivered_before), len(again))
    assert replay["rescheduled"] == len(RESCHEDULED)
    scheduled_after = [i for i in after_ids if first_ms.get(i, 1e20) >= archive_start_ms]
    assert replay["scheduled_after"] == len(scheduled_after), replay
    assert not set(scheduled_after) & first_ms.keys(), "restored without a payload?"
    assert replay["died_after"] == 0
    assert restored["counts"].get("waiting:CREATED") == len(snapshot), restored["counts"]

    outage = result.lateness_between(loss_ms, resumed_ms)
    everything = sorted(result.lateness_ms.values())
    print(f"e2e: DR drill: backed up {len(snapshot)} waiting messages in "
          f"{backed_up['seconds']:.1f}s (job) / {(backup_end_ms - backup_start_ms) / 1000:.1f}s "
          f"(the Job: pod start and JVM included); restored "
          f"{restored['counts'].get('waiting:CREATED')} in "
          f"{restored['seconds']:.1f}s (job) / {(resumed_ms - restore_start_ms) / 1000:.1f}s "
          f"(with the JVM and the replay); replay: {replay['finished']} finished after the "
          f"snapshot ({len(CANCELLED)} cancelled, {replay['finished'] - len(CANCELLED)} "
          f"delivered), {replay['rescheduled']} rescheduled, {replay['scheduled_after']} "
          f"scheduled after it not recoverable ({len(delivered_after)} of {AFTER} were "
          f"delivered before the loss); {len(again)} delivered again (first delivered after "
          f"the last archive run began)")
    print(f"e2e: DR drill: loss to brokers back {(recovered_ms - loss_ms) / 1000:.1f}s, loss "
          f"to delivery resumed {(resumed_ms - loss_ms) / 1000:.1f}s")
    print(f"e2e: DR drill checker: {len(expected)} expected (the {len(CANCELLED)} cancelled "
          f"and the {AFTER} scheduled after the snapshot aside), 0 lost, 0 early, "
          f"{len(result.duplicates)} delivered more than once ({len(again)} of them again "
          f"after the restore); lateness of all "
          f"{_figures(everything)}; of the {len(outage)} due during the outage {_figures(outage)}")
    print(f"e2e: DR drill took {time.monotonic() - started:.1f}s")
