"""Issue 27's hostile tenant on real pods: while a victim's webhook topic in namespace A keeps
delivering a steady stream, a tenant namespace B (namespace-admin there: DelayTopics, Pods,
Services) tries every attack on the coordination endpoints at once, and a counting checker
shows the victim lost nothing.

The release is the chart's, on the real node, watching both namespaces (the operator's admin
digest, its ZooKeeper client and the victim's service pods are the real ones); the tenant's
fake ZooKeeper is a pod in B behind a Service, as a tenant would run it: it answers the
handshake, so a client that connected would go on to send its digest. The chroot-less
connect of attack 3 is not tried here: the bundled ensemble has no chroot (`zookeeper.address`
applies only with `zookeeper.enabled=false`), so a chroot'd platform would need a second
ZooKeeper outside the release; `tests/kube/test_deletion.py::
test_a_connect_without_the_platforms_chroot_never_wipes_the_tenants_trees` holds it on a real
ZooKeeper.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from delayq.kube.zk import TIMEOUT_S
from e2e import workloads
from e2e.harness.kube import Kube
from e2e.harness.node import RealNode
from e2e.harness.operator import lease_holder
from e2e.harness.real_release import CHART, SERVICE_CIDR, Install, helm_args
from e2e.harness.topics import (
    delay_topic,
    described_with,
    ready_condition,
    reconciled,
    topic_children,
)
from e2e.test_real_pods import (
    HTTP_GET,
    SERVICE_PORT,
    _in_pod,
    _pods,
    _produce,
    _wait_delivered,
    _wait_pods_ready,
    _wait_topic_ready,
)

RELEASE = "hostile"
FULLNAME = "hostile-delayq"
VICTIM = "victim"
SLOTS = 16
#: The victim's spec.zookeeper.sessionTimeout (the CRD's default): a slot whose member is gone
#: is taken over within it, so no message may wait longer than this past its due time.
FAILOVER_BOUND_MS = 10_000
#: TEST-NET-1 (RFC 5737): routed nowhere, a ZooKeeper host that never answers.
BLACKHOLE = "192.0.2.1:2181"

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Tenants:
    """The release (its namespace, the victim's namespace A as its tenant) and namespace B."""

    install: Install
    hostile: str


@pytest.fixture(scope="module")
def tenants(kube: Kube, real_node: RealNode) -> Iterator[Tenants]:
    """``helm install --wait`` on the real node, watching the victim's and the hostile
    tenant's namespaces (the chart's default ensemble only: no `allowedEnsembles`)."""
    namespace = f"e2e-hostile-system-{secrets.token_hex(3)}"
    victim = f"e2e-victim-{secrets.token_hex(3)}"
    hostile = f"e2e-hostile-{secrets.token_hex(3)}"
    for name in (victim, hostile):
        kube.kubectl("create", "namespace", name)
    image = real_node.images["delayq"].ref
    kube.helm("install", RELEASE, str(CHART), "--namespace", namespace, "--create-namespace",
              "--wait", "--timeout", "5m", *helm_args(real_node, victim, image),
              "--set", f"operator.watchNamespaces={{{victim},{hostile}}}", timeout=360)
    yield Tenants(Install(namespace, victim, image), hostile)
    kube.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m",
              timeout=240, check=False)
    for name in (victim, hostile, namespace):
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


#: The victim's tree and namespace B's as the operator's admin sees them (argv: the victim's
#: topic root, B's namespace root), read in an operator pod with its own credentials.
ZOOKEEPER_TREES = """
import json, os, sys
from kazoo.client import KazooClient
topic, hostile = sys.argv[1], sys.argv[2]
password = os.environ["DELAYQ_ZOOKEEPER_ADMIN_PASSWORD"]
client = KazooClient(hosts=os.environ["DELAYQ_ZOOKEEPER"], timeout=10,
                     auth_data=[("digest", "delayq-operator:" + password)])
client.start(timeout=30)
members = {}
for member in client.get_children(topic + "/members"):
    data, stat = client.get(topic + "/members/" + member)
    members[member] = {"data": json.loads(data), "ephemeral": stat.ephemeralOwner != 0}
print(json.dumps({"members": members,
                  "assignment": json.loads(client.get(topic + "/assignment")[0]),
                  "routing": client.get(topic + "/routing")[0].decode(),
                  "hostile": client.get_children(hostile) if client.exists(hostile) else None}))
client.stop()
"""

#: Connects from the pod it runs in to host:port (argv) and sends the bytes of argv 3.
PROBE = ("import socket, sys\n"
         "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:\n"
         " s.sendall(sys.argv[3].encode())")


def _trees(kube: Kube, tenants: Tenants) -> dict[str, Any]:
    ns = tenants.install.namespace
    leader = lease_holder(kube, ns).rsplit("_", 1)[0]
    out = _in_pod(kube, ns, leader, ZOOKEEPER_TREES,
                  f"/delayq/{tenants.install.tenant}/{VICTIM}", f"/delayq/{tenants.hostile}")
    decoded: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return decoded


def _admin_password(kube: Kube, tenants: Tenants) -> str:
    secret = kube.get("secret", f"{FULLNAME}-zookeeper-admin", tenants.install.namespace)
    assert secret is not None
    return base64.b64decode(secret["data"]["admin-password"]).decode()


def _fake_zookeeper_log(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    logs = kube.kubectl("logs", "deployment/zookeeper", "-n", namespace, "--tail=-1").stdout
    return workloads.json_lines(logs)


def _deliveries(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """Every delivery the receiver logged, duplicates included."""
    logs = kube.kubectl("logs", "deployment/receiver", "-n", namespace, "--tail=-1").stdout
    return [entry for entry in workloads.json_lines(logs) if "id" in entry]


def _refused(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    ready = ready_condition(kube, namespace, name)
    return ready if ready.get("reason") == "TenantPolicyExceeded" else None


def test_a_hostile_tenant_gets_nothing_while_the_victim_keeps_delivering(
    kube: Kube, tenants: Tenants
) -> None:
    """Attacks 1, 2, 4 and 6 of issue 27 from namespace B, all at once, against a victim topic
    in A on real pods with 400 messages due over 40 s and 100 more scheduled after the
    attacks:

    1. `connect` at a fake ZooKeeper B runs (a pod that answers the handshake and records
       every byte): refused, and not one connection from the operator, let alone its admin
       digest (a probe from the operator's pod proves the path was open and the fake
       records);
    2. a chroot into the victim's members: refused by the API server (the CRD's pattern);
    4. three topics at a host that never answers: refused at once; a change of the victim
       applied at the same moment is reconciled within the operator's ZooKeeper timeout;
    6. `169.254.169.254:80,<platform zk>`: refused, no NetworkPolicy in B opens port 80.

    Each hostile topic ends Ready=False `TenantPolicyExceeded` with a Warning Event in
    `kubectl describe` and has no child. The victim: every message delivered, none early,
    none later than the failover bound (no slot left unconsumed past it), every slot consumed
    at the end, its members in ZooKeeper its own two ephemeral service pods, its routing
    unchanged, and B has no tree at all."""
    victim_ns, hostile_ns = tenants.install.tenant, tenants.hostile
    image = tenants.install.image
    platform = f"{FULLNAME}-zookeeper.{tenants.install.namespace}.svc"
    secret = workloads.SIGNING_SECRET
    kube.apply({"apiVersion": "v1", "kind": "List", "items": [
        *workloads.receiver(victim_ns, image, "whsec_" + secrets.token_hex(32)),
        *workloads.fake_zookeeper(hostile_ns, image, "zookeeper")]})
    url = f"http://receiver.{victim_ns}.svc.cluster.local/hook"
    kube.apply(delay_topic(VICTIM, slotAmount=SLOTS, brokers=2, replicasPerBroker=0,
                           topicType="webhook",
                           delivery={"webhook": {"url": url, "allowInsecureHttp": True,
                                                 "allowedCidrs": [SERVICE_CIDR],
                                                 "signingSecretRef": {"name": secret,
                                                                      "key": secret}}}),
               victim_ns)
    try:
        _wait_topic_ready(kube, victim_ns, VICTIM)
        service_pods = {p["metadata"]["name"] for p in _wait_pods_ready(
            kube, victim_ns, f"delayq.io/topic={VICTIM}", 4)
            if "-service-" in p["metadata"]["name"]}
        _wait_pods_ready(kube, victim_ns, "app=receiver", 1)
        kube.wait(lambda: any("listening" in e for e in _fake_zookeeper_log(kube, hostile_ns)),
                  timeout_s=120, what="the tenant's fake ZooKeeper listening")
        before = _trees(kube, tenants)
        _produce(kube, tenants.install, VICTIM, "steady", 400, start_ms=5000, spread_ms=40000)

        # attacks 1, 4 and 6 together, as one tenant would apply them
        fake = f"zookeeper.{hostile_ns}.svc:2181"
        hostile_topics = {"thief": fake, "stall-0": BLACKHOLE, "stall-1": BLACKHOLE,
                          "stall-2": BLACKHOLE, "metadata": f"169.254.169.254:80,{platform}:2181"}
        start = time.monotonic()
        kube.apply({"apiVersion": "v1", "kind": "List", "items": [
            {**delay_topic(name, slotAmount=SLOTS, brokers=1, replicasPerBroker=0,
                           zookeeper={"connect": connect}),
             "metadata": {"name": name, "namespace": hostile_ns}}
            for name, connect in hostile_topics.items()]})
        # the victim changes meanwhile (a NetworkPolicy peer, no pod rolls): its reconcile,
        # which publishes its routing through the operator's ZooKeeper client, must not wait
        # on the three topics naming a host that never answers
        kube.kubectl("patch", "dt", VICTIM, "-n", victim_ns, "--type", "merge", "-p", json.dumps(
            {"spec": {"networkPolicy": {"allowFrom": [
                {"podSelector": {"matchLabels": {"app": "receiver"}}}]}}}))
        kube.wait(lambda: reconciled(kube, victim_ns, VICTIM), timeout_s=60,
                  what="the victim's change reconciled")
        reconciled_s = time.monotonic() - start
        print(f"e2e: the victim's change reconciled {reconciled_s:.1f}s after the attacks")
        assert reconciled_s < TIMEOUT_S, "the victim's reconcile waited on a stalled ensemble"
        # attack 2: a chroot into the victim's members, refused by the API server itself
        squatter = delay_topic("squatter", slotAmount=SLOTS, brokers=1, replicasPerBroker=0,
                               zookeeper={"connect": f"{platform}:2181/delayq/{victim_ns}/"
                                                     f"{VICTIM}/members"})
        applied = kube.kubectl("apply", "-f", "-", "-n", hostile_ns,
                               input=yaml.safe_dump(squatter), check=False)
        assert applied.returncode != 0, "a chroot into the victim's tree was admitted"
        assert "spec.zookeeper.connect" in applied.stderr, applied.stderr
        assert kube.get("dt", "squatter", hostile_ns) is None

        for name, connect in hostile_topics.items():
            refused = kube.wait(functools.partial(_refused, kube, hostile_ns, name),
                                timeout_s=60, what=f"{name} Ready=False TenantPolicyExceeded")
            assert refused["status"] == "False"
            assert refused["message"].startswith(f"spec.zookeeper.connect '{connect}'"), refused
        print(f"e2e: 5 hostile topics refused {time.monotonic() - start:.1f}s after the apply")
        for name in hostile_topics:
            described = kube.wait(
                functools.partial(described_with, kube, hostile_ns, name,
                                  ("TenantPolicyExceeded",)),
                timeout_s=30, what=f"the TenantPolicyExceeded Event of {name} in describe")
            events = described.partition("\nEvents:")[2]
            assert re.search(r"Warning\s+TenantPolicyExceeded", events), events
            assert topic_children(kube, hostile_ns, name) == [], f"{name} got children"
        policies = kube.items("networkpolicies", hostile_ns)
        assert not [p for p in policies if '"port": 80' in json.dumps(p)], policies

        # the fake ZooKeeper saw nothing of the operator; a probe from the operator's own pod
        # shows it was reachable and records what it is sent
        assert not [e for e in _fake_zookeeper_log(kube, hostile_ns) if "connection" in e]
        probe = f"probe-{secrets.token_hex(4)}"
        leader = lease_holder(kube, tenants.install.namespace).rsplit("_", 1)[0]
        _in_pod(kube, tenants.install.namespace, leader, PROBE, f"zookeeper.{hostile_ns}.svc",
                "2181", probe)
        kube.wait(lambda: any(e.get("hex") == probe.encode().hex()
                              for e in _fake_zookeeper_log(kube, hostile_ns)),
                  timeout_s=30, what="the probe recorded by the fake ZooKeeper")

        _produce(kube, tenants.install, VICTIM, "after", 100, start_ms=2000, spread_ms=5000)
        ids = [f"steady-{i}" for i in range(400)] + [f"after-{i}" for i in range(100)]
        _wait_delivered(kube, victim_ns, VICTIM, ids, timeout_s=120)

        # the counting checker
        deliveries = _deliveries(kube, victim_ns)
        first: dict[str, dict[str, Any]] = {}
        for entry in deliveries:
            first.setdefault(entry["id"], entry)
        lost = [i for i in ids if i not in first]
        early = [e["id"] for e in deliveries if e["atMs"] < e["dueMs"]]
        lateness = sorted(first[i]["atMs"] - first[i]["dueMs"] for i in ids if i in first)
        duplicates = len(deliveries) - len(first)
        print(f"e2e: hostile-tenant victim: sent {len(ids)}, delivered {len(first)}, "
              f"duplicates {duplicates}, early {len(early)}, lateness p50 "
              f"{lateness[len(lateness) // 2]:.1f} ms, p99 "
              f"{lateness[int(len(lateness) * 0.99)]:.1f} ms, max {lateness[-1]:.1f} ms")
        assert not lost, lost[:5]
        assert not early, early[:5]
        assert all(first[i]["verified"] for i in ids), "a signature the receiver refused"
        assert lateness[-1] < FAILOVER_BOUND_MS, "a slot went unconsumed past the bound"
        consumed: set[int] = set()
        for pod in sorted(service_pods):
            ready = json.loads(_in_pod(kube, victim_ns, pod, HTTP_GET, str(SERVICE_PORT),
                                       "/readyz"))
            assert ready["unconsumedSlots"] == {}, (pod, ready)
            consumed |= set(ready["consumedSlots"])
        assert consumed == set(range(SLOTS)), sorted(consumed)

        after = _trees(kube, tenants)
        print(f"e2e: the victim's members before {sorted(before['members'])}, after "
              f"{sorted(after['members'])}")
        assert after["routing"] == before["routing"], "the victim's routing changed"
        for tree in (before, after):
            members = tree["members"]
            assert len(members) == len(service_pods), members
            assert all(m["ephemeral"] for m in members.values()), members
            assert {m["data"]["host"] for m in members.values()} == service_pods, members
            assignment = tree["assignment"]
            assert set(assignment["members"]) == set(members), assignment
            assert -1 not in assignment["slots"], assignment
        assert not after["hostile"], f"namespace B has a tree: {after['hostile']}"

        log = _fake_zookeeper_log(kube, hostile_ns)
        assert len([e for e in log if "connection" in e]) == 1, log  # the probe's, no other
        received = b"".join(bytes.fromhex(e["hex"]) for e in log if "hex" in e)
        assert received == probe.encode(), received  # no handshake, no digest: the probe only
        assert _admin_password(kube, tenants).encode() not in received
    except Exception:
        print(kube.kubectl("get", "events", "-n", hostile_ns, check=False).stdout)
        recorded = _fake_zookeeper_log(kube, hostile_ns)
        sent = b"".join(bytes.fromhex(e["hex"]) for e in recorded if "hex" in e)
        print(f"--- the fake ZooKeeper recorded {recorded}; the admin password among the "
              f"bytes: {_admin_password(kube, tenants).encode() in sent}")
        for pod in _pods(kube, tenants.install.namespace, "app.kubernetes.io/component=operator"):
            print(kube.kubectl("logs", pod["metadata"]["name"], "-n", tenants.install.namespace,
                               "--tail=40", check=False).stdout)
        raise
    finally:
        kube.kubectl("delete", "dt", "--all", "-n", hostile_ns, "--wait=false", check=False)
        kube.kubectl("delete", "dt", VICTIM, "-n", victim_ns, "--wait=false", check=False)
