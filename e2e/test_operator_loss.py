"""What outlives the operator process (issue 5, point 6; the chart's high availability): a
standby replica takes over the leader Lease after `kill -9` of the leader, deletions never hang
with every operator killed, and a restarted operator collects what they left in ZooKeeper."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.kube import Kube, Release
from e2e.harness.operator import (
    LEASE_DURATION_S,
    RETRY_INTERVAL_S,
    LocalOperator,
    chart_env,
    lease_holder,
    tenant_namespace,
)
from e2e.harness.process import REPO
from e2e.harness.topics import (
    TOPIC_LABEL,
    all_pods_running,
    delay_topic,
    redis_statefulsets,
    wait_reconciled,
)


def _replica(name: str, namespace: str, kube: Kube, kubeconfig: Path,
             chart_release: Release, zookeeper: ZooKeeperServer, workdir: Path) -> LocalOperator:
    """One replica of the chart's Deployment, as a local process: it campaigns for the Lease."""
    return LocalOperator(
        repo=REPO, kubeconfig=kubeconfig, namespaces=[namespace],
        log_path=workdir / f"{name}.log", standalone=False,
        env_overrides={**chart_env(kube, chart_release, zookeeper), "POD_NAME": name,
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    )


def test_one_leader_reconciles_and_a_standby_takes_over_after_kill_9(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two replicas: exactly one holds the Lease and reconciles; SIGKILL it and the other
    reconciles the next change within the lease duration plus a few seconds."""
    ns = f"e2e-leader-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("leader")
    replicas = {name: _replica(name, ns, kube, operator_kubeconfig, chart_release, zookeeper,
                               workdir) for name in ("op-a", "op-b")}
    try:
        for replica in replicas.values():
            replica.start()
        holder = kube.wait(lambda: lease_holder(kube, chart_release.namespace), timeout_s=60,
                           what="one replica to hold the leader Lease")
        leader_name = holder.rsplit("_", 1)[0]
        (standby_name,) = set(replicas) - {leader_name}
        leader, standby = replicas[leader_name], replicas[standby_name]

        kube.apply(delay_topic("elected", slotAmount=16, brokers=1), ns)
        wait_reconciled(kube, leader, ns, "elected")
        # kopf logs the handler's success after the status patch the wait above saw: the log
        # line may come a moment later
        kube.wait(lambda: "Handler 'reconcile' succeeded" in leader.log_path.read_text(),
                  timeout_s=30, what="the leader's log to record the reconcile's success")
        standby_log = standby.log_path.read_text()
        assert "campaigning for the lease" in standby_log
        assert "Handler" not in standby_log, "the standby ran a kopf handler"
        assert lease_holder(kube, chart_release.namespace) == holder

        leader.kill()
        killed = time.monotonic()
        kube.apply(delay_topic("elected", slotAmount=16, brokers=2), ns)
        wait_reconciled(kube, standby, ns, "elected",
                        timeout=LEASE_DURATION_S + RETRY_INTERVAL_S + 60)
        takeover_s = time.monotonic() - killed
        print(f"e2e: after kill -9 of the leader, the standby reconciled in {takeover_s:.1f}s")
        assert lease_holder(kube, chart_release.namespace).startswith(f"{standby_name}_")
        assert takeover_s <= LEASE_DURATION_S + RETRY_INTERVAL_S + 8
        assert len(redis_statefulsets(kube, ns, "elected")) == 2
    except Exception:
        for name, replica in replicas.items():
            print(f"--- {name} log tail:\n{replica.tail()}")
        raise
    finally:
        for replica in replicas.values():
            replica.stop()  # SIGTERM: the leader releases the Lease for the next test
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def _tree_exists(zookeeper: ZooKeeperServer, namespace: str, topic: str) -> bool:
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=30)
    try:
        return client.exists(f"/delayq/{namespace}/{topic}") is not None
    finally:
        client.stop()
        client.close()


def test_deletions_never_hang_with_every_operator_killed_and_a_restart_collects_zookeeper(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Point 6: with every operator killed -9, deleting a topic and then its namespace
    completes (no finalizer: owner references and the StatefulSets' volume claim retention
    policy clean up); a restarted operator garbage-collects the topics' ZooKeeper trees. The
    finalizer of an older operator version is removed by the first operator that sees it."""
    ns = f"e2e-nsdel-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("operator-nsdel")
    first = _replica("op-first", ns, kube, operator_kubeconfig, chart_release, zookeeper,
                     workdir).start()
    restarted: LocalOperator | None = None
    try:
        legacy = delay_topic("legacy", brokers=1)
        legacy["metadata"]["finalizers"] = ["delayq.io/finalizer", "example.com/keep"]
        kube.apply(legacy, ns)
        kube.wait(lambda: (kube.get("dt", "legacy", ns) or {})["metadata"].get("finalizers")
                  == ["example.com/keep"], timeout_s=60, what="the old finalizer to be removed")
        kube.kubectl("patch", "dt", "legacy", "-n", ns, "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}')
        kube.apply(delay_topic("doomed", brokers=1, deletionPolicy="Delete"), ns)
        kube.apply(delay_topic("bystander", brokers=1), ns)
        for name in ("doomed", "bystander"):
            wait_reconciled(kube, first, ns, name)
            assert _tree_exists(zookeeper, ns, name)
        kube.wait(lambda: all_pods_running(kube, ns, "doomed"), timeout_s=120,
                  what="the doomed topic's pods Running (their volume claims created)")
        assert kube.items("pvc", ns, selector=f"{TOPIC_LABEL}=doomed")
        first.kill()

        kube.kubectl("delete", "dt", "doomed", "-n", ns, "--wait=false")
        kube.wait(lambda: kube.get("dt", "doomed", ns) is None, timeout_s=30,
                  what="the topic to be deleted with every operator killed")
        kube.wait(lambda: not kube.items("pvc", ns, selector=f"{TOPIC_LABEL}=doomed"),
                  timeout_s=120, what="deletionPolicy Delete: the volume claims removed by "
                  "the StatefulSet controller")
        kube.kubectl("delete", "namespace", ns, "--wait=false")
        kube.wait(lambda: kube.get("namespace", ns) is None, timeout_s=90,
                  what=f"namespace {ns} to be deleted with every operator killed")
        assert _tree_exists(zookeeper, ns, "doomed")  # nobody could collect it yet

        # The restart waits out the killed leader's Lease, then its health loop collects.
        restarted = _replica("op-restarted", ns, kube, operator_kubeconfig, chart_release,
                             zookeeper, workdir).start()
        kube.wait(lambda: not _tree_exists(zookeeper, ns, "doomed")
                  and not _tree_exists(zookeeper, ns, "bystander"),
                  timeout_s=LEASE_DURATION_S + 60,
                  what="the restarted operator to remove the deleted topics' ZooKeeper trees")
    except Exception:
        for replica in (first, restarted):
            if replica is not None:
                print(f"--- {replica.log_path.name} tail:\n{replica.tail()}")
        raise
    finally:
        first.kill()
        if restarted is not None:
            restarted.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
