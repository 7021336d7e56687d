"""Failover on a real control plane (issue 5, point 5; issue 13: its Events): the master pod is
deleted, the operator promotes the replica, nothing scheduled is lost, and the old master, back
as a master, is demoted.

Two local redis-servers play the broker's two pods through the operator's test-only address
map (e2e/operator_main.py), so the topic reaches ``Ready=True`` (point 3) here.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.dataplane import (
    admin,
    like_a_broker_pod,
    replication,
    schedule,
    service_url,
    start_serve,
)
from e2e.harness.kube import Kube, Release, condition
from e2e.harness.operator import LocalOperator, chart_env, tenant_namespace
from e2e.harness.process import INTERVAL_S, NOT_YET, REPO, ManagedProcess
from e2e.harness.receiver import Received, received_one
from e2e.harness.topics import (
    all_pods_running,
    delay_topic,
    described_with,
    topic_credentials,
    topic_secret,
    wait_reconciled,
)

#: The topic status right after the failover test's promotion, for the test that follows it.
_FAILOVER_STATUS: dict[str, Any] = {}


def test_failover_promotes_the_replica_and_keeps_scheduled_messages(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
    webhook_receiver: tuple[str, Received],
) -> None:
    """Point 5: the master pod is deleted; the operator promotes the replica; nothing is lost;
    the old master, back as a master, is demoted (issue 13: Events of failover and demotion).

    Two local redis-servers play the broker's two pods (replica replicating from master) via
    the operator's test-only address map (e2e/operator_main.py). With both answering, the
    topic reaches Ready=True (point 3). A message is scheduled and replicated; then the master
    pod is deleted and its Redis killed. After the failover grace the operator must promote the
    replica (REPLICAOF NO ONE on the right process, the master Service's EndpointSlice, status
    with lastFailoverTime)
    and, once delayq serve runs against the new master, the message is delivered, never early.
    """
    url, received = webhook_receiver
    ns = f"e2e-failover-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("failover")
    addresses = workdir / "addresses.json"
    closed = ["127.0.0.1", free_port()]  # nothing listens: unmapped pods fail fast
    addresses.write_text(json.dumps({"*": closed}))
    op = LocalOperator(
        repo=REPO, kubeconfig=operator_kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log", addresses_file=addresses,
        env_overrides={**chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_HEALTH_INTERVAL_S": "1", "DELAYQ_FAILOVER_GRACE_S": "3"},
    ).start()
    master, replica, returned = RedisServer(), RedisServer(), RedisServer()
    serve: ManagedProcess | None = None
    try:
        kube.apply(delay_topic("fo", slotAmount=16, brokers=1, replicasPerBroker=1,
                               topicType="webhook",
                               delivery={"webhook": {"url": url, "allowPrivateTargets": True,
                                                     "allowInsecureHttp": True}}), ns)
        wait_reconciled(kube, op, ns, "fo")
        pods = kube.wait(lambda: all_pods_running(kube, ns, "fo"), timeout_s=120,
                         what="the topic's pods Running")
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
        first, second = _first_master_then_replica(pods)
        password, token = topic_credentials(kube, ns, "fo")
        master.start()
        replica.start()
        admin_password = topic_secret(kube, ns, "fo", "redis-admin-password")
        for server in (master, replica):
            like_a_broker_pod(kube, ns, "fo", server.port)
        with admin(replica.port, admin_password) as client:
            client.replicaof("127.0.0.1", master.port)
        service_host = f"fo-redis-0.{ns}.svc"
        addresses.write_text(json.dumps({
            "*": closed, ips[first]: ["127.0.0.1", master.port],
            ips[second]: ["127.0.0.1", replica.port],
            service_host: ["127.0.0.1", master.port]}))

        def serving_with(master_pod: str) -> dict[str, Any] | None:
            topic = kube.get("dt", "fo", ns)
            brokers = (topic or {}).get("status", {}).get("brokers") or [{}]
            ok = condition(topic, "Ready") == "True" and brokers[0].get("masterPod") == master_pod
            return topic if ok else None

        kube.wait(lambda: serving_with(first), timeout_s=90,
                  what=f"Ready=True with {first} as master")

        serve, base = start_serve(kube, ns, "fo", workdir,
                                  service_url(password, master.port))
        schedule(base, "fo", token, "before-failover", delay_ms=15000)
        wait_until(lambda: replication(replica.port, admin_password).get("master_link_status")
                   == "up" and replication(replica.port, admin_password).get("slave_repl_offset")
                   == replication(master.port, admin_password).get("master_repl_offset"),
                   timeout_s=30, what="the replica to have replicated the message",
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
        serve.stop()
        serve = None

        master.stop()
        kube.kubectl("delete", "pod", first, "-n", ns, "--wait=false")
        addresses.write_text(json.dumps({
            "*": closed, ips[second]: ["127.0.0.1", replica.port],
            service_host: ["127.0.0.1", replica.port]}))
        topic = kube.wait(lambda: serving_with(second), timeout_s=120,
                          what=f"the replica {second} promoted and Ready=True")
        _FAILOVER_STATUS.update(topic["status"])
        assert replication(replica.port, admin_password)["role"] == "master"
        # the master Service follows the operator's EndpointSlice: no selector, no pod label
        promoted = kube.get("pod", second, ns)
        assert promoted is not None
        assert "delayq.io/redis-role" not in promoted["metadata"]["labels"]
        endpoint = kube.get("endpointslice", "fo-redis-0", ns)
        assert endpoint is not None
        assert [e["addresses"] for e in endpoint["endpoints"]] == [[ips[second]]]
        assert endpoint["metadata"]["labels"]["kubernetes.io/service-name"] == "fo-redis-0"
        service = kube.get("service", "fo-redis-0", ns)
        assert service is not None
        assert "selector" not in service["spec"]
        # What a user sees: the failover in `kubectl describe dt`, once each, and in /metrics.
        described = wait_until(
            lambda: described_with(kube, ns, "fo", ("FailoverStarted", "FailoverPromoted")),
            timeout_s=30, what="the failover Events in kubectl describe", interval_s=INTERVAL_S,
            not_yet=NOT_YET)
        assert f"promoted {second} to master after {first} was gone" in described
        events = kube.items("events", ns)
        reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "fo"]
        assert reasons.count("FailoverPromoted") == 1
        assert reasons.count("FailoverStarted") == 1
        assert op.metric("delayq_operator_failovers_total",
                         {"topic_namespace": ns, "topic": "fo"}) == 1
        assert op.metric("delayq_operator_is_leader", {}) == 1

        serve, base = start_serve(kube, ns, "fo", workdir,
                                  service_url(password, replica.port))
        arrival_ms, message = wait_until(lambda: received_one(received, "before-failover"),
                                         timeout_s=90, what="the pre-failover message delivered",
                                         abort=serve.exited, interval_s=INTERVAL_S,
                                         not_yet=NOT_YET)
        assert message["dueMs"] <= arrival_ms, "delivered before it was due"

        # The lost master's pod is back (the StatefulSet made it again) and its Redis still
        # acts as a master, as one cut off by a partition would: demoted, told in describe.
        def back() -> dict[str, Any] | None:
            pod = kube.get("pod", first, ns)
            ok = (pod and pod["status"].get("phase") == "Running"
                  and pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp"))
            return pod if ok else None

        returned_ip = kube.wait(back, timeout_s=60, what=f"{first} made again")["status"][
            "podIP"]
        returned.start()
        like_a_broker_pod(kube, ns, "fo", returned.port)
        addresses.write_text(json.dumps({
            "*": closed, ips[second]: ["127.0.0.1", replica.port],
            returned_ip: ["127.0.0.1", returned.port],
            service_host: ["127.0.0.1", replica.port]}))
        described = wait_until(
            lambda: described_with(kube, ns, "fo", ("StrayMasterDemoted",)),
            timeout_s=30, what="the demotion Event in kubectl describe", interval_s=INTERVAL_S,
            not_yet=NOT_YET)
        assert f"{first} still acted as a master; it now replicates from {second}" \
            in " ".join(described.split())
        assert replication(returned.port, admin_password)["role"] == "slave"
        assert replication(replica.port, admin_password)["role"] == "master"
    except Exception:
        print(f"--- failover operator log tail:\n{op.tail()}")
        for what in (["get", "pods,nodes", "-o", "wide", "-n", ns], ["get", "events", "-n", ns]):
            print(f"--- kubectl {' '.join(what)}:\n{kube.kubectl(*what, check=False).stdout}")
        if serve is not None:
            print(f"--- delayq serve log tail:\n{serve.tail(60)}")
        raise
    finally:
        if serve is not None:
            serve.stop()
        kube.kubectl("delete", "dt", "fo", "-n", ns, "--wait=false", check=False)
        try:
            kube.wait(lambda: kube.get("dt", "fo", ns) is None, timeout_s=60,
                      what="the failover topic to be deleted")
        finally:
            op.stop()
            master.stop()
            replica.stop()
            returned.stop()
            kube.kubectl("delete", "namespace", ns, "--wait=false")


def _first_master_then_replica(pods: list[dict[str, Any]]) -> tuple[str, str]:
    """Broker 0's two Redis pods, the one its first election picks first: the pod on service
    pod 0's node (kube/failover.py; the scheduler may put either there), else pod 0."""
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    beside = [name for name in ("fo-redis-0-0", "fo-redis-0-1")
              if nodes.get(name) and nodes.get(name) == nodes.get("fo-service-0")]
    first = (beside or ["fo-redis-0-0"])[0]
    return first, ({"fo-redis-0-0", "fo-redis-0-1"} - {first}).pop()


def test_failover_is_recorded_in_the_status() -> None:
    """Point 5: the promotion after the master's loss is reported as a failover in the status.

    Reads the status the failover test captured right after the promotion.
    """
    assert _FAILOVER_STATUS, "the failover test did not get as far as the promotion"
    broker = _FAILOVER_STATUS["brokers"][0]
    assert broker.get("lastFailoverTime")
