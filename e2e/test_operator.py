"""The operator against a real control plane (issue 5, points 3, 4, 6 and 7).

The operator runs as a local process (``LocalOperator``) with the chart's ServiceAccount token,
so it has exactly the RBAC the chart grants; a local ZooKeeper plays the ensemble. KWOK makes
the pods it creates Running; the Redis inside them does not exist, so these tests stop short of
``Ready=True`` (that needs the data plane reachable, see docs/e2e.md).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import acl
from e2e.harness.kube import Kube, Release, condition, service_account_kubeconfig
from e2e.harness.operator import LocalOperator
from e2e.harness.process import INTERVAL_S, NOT_YET, ManagedProcess

REPO = Path(__file__).resolve().parent.parent
TOPIC_LABEL = "delayq.io/topic"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Every kind the operator creates for a topic (ServiceMonitor only with Prometheus Operator).
CHILD_KINDS = ("statefulsets", "services", "configmaps", "secrets", "poddisruptionbudgets",
               "networkpolicies")


def _topic(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "delayq.io/v1alpha1", "kind": "DelayTopic",
            "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def topics_ns(kube: Kube) -> Iterator[str]:
    """The namespace the local operator watches (and only that one)."""
    name = f"e2e-topics-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    kube.wait(lambda: kube.get("serviceaccount", "default", name), timeout_s=60,
              what=f"the default ServiceAccount in {name}")
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _chart_env(kube: Kube, chart_release: Release, zookeeper: ZooKeeperServer) -> dict[str, str]:
    """What the chart's operator Deployment gives its container, with the local ZooKeeper: the
    release namespace and the ZooKeeper admin password from the chart's Secret (so every topic
    tree gets its ACLs, as in a real install). The platform lets topics opt out of the SSRF
    guard (`tenantPolicy.allowPrivateTargets`): the tests' webhook receivers are on loopback."""
    secret = kube.get("secret", f"{chart_release.fullname}-zookeeper-admin",
                      chart_release.namespace)
    assert secret is not None, "the chart's ZooKeeper admin Secret"
    return {"DELAYQ_ZOOKEEPER": zookeeper.hosts, "POD_NAMESPACE": chart_release.namespace,
            "DELAYQ_ZOOKEEPER_ADMIN_PASSWORD":
                base64.b64decode(secret["data"]["admin-password"]).decode(),
            "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "true"}


def _operator_kubeconfig(kube: Kube, chart_release: Release, workdir: Path,
                         namespace: str) -> Path:
    """A kubeconfig with the chart's ServiceAccount token (the operator's RBAC, exactly), once
    its grants are in effect for `namespace`: kopf discovers its resources once at start-up, and
    if the freshly installed RBAC has not yet reached the API server's authorizer cache, it
    would start blind."""
    kubeconfig = service_account_kubeconfig(
        kube, chart_release.namespace, chart_release.service_account, workdir / "kubeconfig")
    as_operator = Kube(kubeconfig, kube.tools, workdir / "client")
    grants = [("list", "customresourcedefinitions.apiextensions.k8s.io", None),
              ("watch", "delaytopics.delayq.io", namespace),
              ("patch", "delaytopics.delayq.io/status", namespace),
              ("create", "statefulsets.apps", namespace)]
    kube.wait(lambda: all(
        as_operator.kubectl("auth", "can-i", verb, resource,
                            *(["-n", ns] if ns else []), check=False).stdout.strip() == "yes"
        for verb, resource, ns in grants),
        timeout_s=60, what="the chart's RBAC to be in effect for the operator's token")
    return kubeconfig


@pytest.fixture(scope="module")
def operator(
    kube: Kube, chart_release: Release, zookeeper: ZooKeeperServer, topics_ns: str,
    tmp_path_factory: pytest.TempPathFactory, local_cluster: bool,
) -> Iterator[LocalOperator]:
    """``delayq operator --standalone -n <topics_ns>`` with the chart's ServiceAccount token."""
    if not local_cluster:
        pytest.skip("needs the local KWOK cluster: on a real cluster the topic's pods really "
                    "run (delayq image, ZooKeeper on this machine's loopback) and the chart's "
                    "own operator pods would reconcile the test topics too")
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = _operator_kubeconfig(kube, chart_release, workdir, topics_ns)
    op = LocalOperator(
        repo=REPO, kubeconfig=kubeconfig, namespaces=[topics_ns],
        log_path=workdir / "operator.log",
        env_overrides={**_chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    )
    with op.running(kube, topics_ns):
        yield op


def _children(kube: Kube, namespace: str, topic: str) -> list[dict[str, Any]]:
    """Every object of the child kinds labelled with the topic."""
    found: list[dict[str, Any]] = []
    for kind in CHILD_KINDS:
        found += kube.items(kind, namespace, selector=f"{TOPIC_LABEL}={topic}")
    return found


def _reconciled(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The topic once status.observedGeneration has caught up and Provisioned is True."""
    obj = kube.get("dt", name, namespace)
    if not obj or obj.get("status", {}).get("observedGeneration") != \
            obj["metadata"]["generation"]:
        return None
    return obj if condition(obj, "Provisioned") == "True" else None


def _wait_reconciled(kube: Kube, op: LocalOperator, namespace: str, name: str,
                     timeout: float = 180) -> dict[str, Any]:
    try:
        return kube.wait(lambda: _reconciled(kube, namespace, name), timeout_s=timeout,
                         what=f"DelayTopic {name} reconciled (observedGeneration, Provisioned)")
    except Exception:
        print(f"--- operator log tail:\n{op.tail()}\n--- topic: {kube.get('dt', name, namespace)}")
        raise


def _redis_statefulsets(kube: Kube, namespace: str, topic: str) -> list[dict[str, Any]]:
    return kube.items("statefulsets", namespace,
                      selector=f"{TOPIC_LABEL}={topic},{COMPONENT_LABEL}=redis")


def _all_pods_running(kube: Kube, namespace: str, topic: str) -> list[dict[str, Any]] | None:
    """Pods of every StatefulSet of the topic, once each set has all its replicas Running."""
    sets = kube.items("statefulsets", namespace, selector=f"{TOPIC_LABEL}={topic}")
    expected = sum(s["spec"]["replicas"] for s in sets)
    pods = kube.items("pods", namespace, selector=f"{TOPIC_LABEL}={topic}")
    running = [p for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    ready_sets = all(s["status"].get("readyReplicas", 0) == s["spec"]["replicas"]
                     and s["status"].get("updatedReplicas", 0) == s["spec"]["replicas"]
                     for s in sets)
    return running if sets and ready_sets and len(running) == expected else None


def test_topic_is_provisioned_with_owned_children(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 3: every child is created, owned by the topic, and its pods run; status follows."""
    kube.apply(_topic("orders", slotAmount=16, brokers=2, replicasPerBroker=1), topics_ns)
    topic = _wait_reconciled(kube, operator, topics_ns, "orders")
    uid = topic["metadata"]["uid"]
    assert not topic["metadata"].get("finalizers"), "a finalizer would need a running operator"
    assert topic["status"]["observedGeneration"] == topic["metadata"]["generation"]
    assert condition(topic, "Ready") is not None
    # The API server accepted the operator's Event: `kubectl describe dt` shows it.
    wait_until(lambda: _described_with(kube, topics_ns, "orders", ("ResourcesApplied",)),
               timeout_s=30, what="the ResourcesApplied Event in kubectl describe",
               interval_s=INTERVAL_S, not_yet=NOT_YET)

    children = _children(kube, topics_ns, "orders")
    kinds = {c["kind"] for c in children}
    assert {"StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds
    for child in children:
        owners = [o for o in child["metadata"].get("ownerReferences", [])
                  if o.get("controller")]
        assert [(o["kind"], o["uid"]) for o in owners] == [("DelayTopic", uid)], \
            f"{child['kind']}/{child['metadata']['name']} is not controlled by the topic"
    assert len(_redis_statefulsets(kube, topics_ns, "orders")) == 2

    pods = kube.wait(lambda: _all_pods_running(kube, topics_ns, "orders"), timeout_s=180,
                     what="every pod of the topic Running (KWOK)")
    assert all(p["spec"].get("nodeName") for p in pods)
    claims = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=orders")
    assert claims
    assert all(c["status"]["phase"] == "Bound" for c in claims)


def test_scaling_and_worker_change_roll_out(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 4: more brokers and a worker setting change roll out; status follows generation."""
    before = _wait_reconciled(kube, operator, topics_ns, "orders")
    service_sets = kube.items("statefulsets", topics_ns,
                              selector=f"{TOPIC_LABEL}=orders,{COMPONENT_LABEL}=delay-service")
    assert len(service_sets) == 1
    service_generation = service_sets[0]["metadata"]["generation"]

    kube.apply(_topic("orders", slotAmount=16, brokers=3, replicasPerBroker=1,
                      worker={"concurrency": 4}), topics_ns)
    after = _wait_reconciled(kube, operator, topics_ns, "orders")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert len(_redis_statefulsets(kube, topics_ns, "orders")) == 3

    def rolled() -> dict[str, Any] | None:
        sets = kube.items("statefulsets", topics_ns,
                          selector=f"{TOPIC_LABEL}=orders,{COMPONENT_LABEL}=delay-service")
        sts = sets[0]
        status = sts["status"]
        done = (sts["metadata"]["generation"] > service_generation
                and status.get("observedGeneration") == sts["metadata"]["generation"]
                and status.get("updateRevision") == status.get("currentRevision")
                and status.get("updatedReplicas") == sts["spec"]["replicas"])
        return sts if done else None

    kube.wait(rolled, timeout_s=180, what="the delay-service StatefulSet to roll out")
    kube.wait(lambda: _all_pods_running(kube, topics_ns, "orders"), timeout_s=180,
              what="every pod Running after the change")


def test_operator_restart_mid_reconcile_converges_without_duplicates(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 7: a SIGKILLed operator, restarted, converges; nothing is duplicated or rotated."""
    operator.kill()
    kube.apply(_topic("restart", slotAmount=16, brokers=3, replicasPerBroker=1), topics_ns)
    operator.start()
    # Kill it again as soon as it has started creating children: mid-reconcile.
    kube.wait(lambda: _children(kube, topics_ns, "restart"), timeout_s=60,
              what="the first child of the topic")
    operator.kill()
    secret_before = kube.get("secret", "restart-credentials", topics_ns)
    operator.start()
    topic = _wait_reconciled(kube, operator, topics_ns, "restart")

    children = _children(kube, topics_ns, "restart")
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(names) == len(set(names))
    assert len(_redis_statefulsets(kube, topics_ns, "restart")) == 3
    condition_types = [c["type"] for c in topic["status"]["conditions"]]
    assert len(condition_types) == len(set(condition_types))
    if secret_before is not None:
        secret_after = kube.get("secret", "restart-credentials", topics_ns)
        assert secret_after is not None
        assert secret_after["data"] == secret_before["data"], "credentials were rotated"
        assert secret_after["metadata"]["uid"] == secret_before["metadata"]["uid"]


def _ready_condition(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The topic's Ready condition ({} while it has none)."""
    topic = kube.get("dt", name, namespace) or {}
    return next((c for c in topic.get("status", {}).get("conditions", [])
                 if c.get("type") == "Ready"), {})


def test_a_change_beyond_the_platforms_cap_is_refused_and_told_in_describe(
    kube: Kube, operator: LocalOperator, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Events for refused changes (issue 13): a change the API server admits but the platform's
    `tenantPolicy` does not (an operator with the chart's default: no private targets) is
    refused before anything is applied: Ready False with `TenantPolicyExceeded` naming the
    field, one Warning Event in `kubectl describe dt`, the delay-service pods' template and
    egress as they were. Brought back within the cap, the topic is provisioned again."""
    ns = f"e2e-capped-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    workdir = tmp_path_factory.mktemp("capped")
    op = LocalOperator(
        repo=REPO, kubeconfig=operator.kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log",
        env_overrides={**_chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "false",
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    ).start()
    hook = {"url": "https://hooks.example.com/delayq"}

    def capped(**webhook: Any) -> dict[str, Any]:
        return _topic("capped", slotAmount=16, brokers=1, replicasPerBroker=0,
                      topicType="webhook", delivery={"webhook": {**hook, **webhook}})

    try:
        kube.apply(capped(), ns)
        _wait_reconciled(kube, op, ns, "capped")
        template = kube.get("statefulset", "capped-service", ns)
        policy = kube.get("networkpolicy", "capped-service", ns)
        assert template is not None
        assert policy is not None

        kube.apply(capped(allowPrivateTargets=True), ns)
        refused = kube.wait(
            lambda: (ready := _ready_condition(kube, ns, "capped")).get("reason")
            == "TenantPolicyExceeded" and ready, timeout_s=60,
            what="Ready=False, TenantPolicyExceeded")
        assert refused["status"] == "False"
        field = "spec.delivery.webhook.allowPrivateTargets: true is not allowed"
        assert refused["message"].startswith(field)
        described = wait_until(
            lambda: _described_with(kube, ns, "capped", ("TenantPolicyExceeded",)),
            timeout_s=30, what="the TenantPolicyExceeded Event in kubectl describe",
            interval_s=INTERVAL_S, not_yet=NOT_YET)
        events = described.partition("\nEvents:")[2]
        assert re.search(r"Warning\s+TenantPolicyExceeded", events), events
        assert field in events
        after = kube.get("statefulset", "capped-service", ns)
        assert after is not None
        assert after["spec"]["template"] == template["spec"]["template"], "the pods were rolled"
        policy_after = kube.get("networkpolicy", "capped-service", ns)
        assert policy_after is not None
        assert policy_after["spec"] == policy["spec"], "the refused targets were admitted"

        kube.apply(capped(), ns)
        _wait_reconciled(kube, op, ns, "capped")
        # Ready past the refusal from the correcting reconcile, as the last health pass saw
        # the brokers (KWOK: no Redis answers, so not Serving)
        kube.wait(lambda: _ready_condition(kube, ns, "capped").get("reason")
                  != "TenantPolicyExceeded", timeout_s=30, what="Ready past the refusal")
        reasons = [e["reason"] for e in kube.items("events", ns)
                   if e["involvedObject"]["name"] == "capped"]
        assert reasons.count("TenantPolicyExceeded") == 1, reasons
    except Exception:
        print(f"--- capped operator log tail:\n{op.tail()}")
        raise
    finally:
        kube.kubectl("delete", "dt", "capped", "-n", ns, "--wait=false", check=False)
        op.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_deleting_the_topic_removes_children(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 6: the topic goes at once (no finalizer); controller-manager collects the children.

    With the default deletionPolicy Retain the Redis volume claims stay behind on purpose.
    """
    _wait_reconciled(kube, operator, topics_ns, "restart")
    claims_before = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=restart")
    kube.kubectl("delete", "dt", "restart", "-n", topics_ns, "--wait=false")
    kube.wait(lambda: kube.get("dt", "restart", topics_ns) is None, timeout_s=120,
              what="the DelayTopic to be gone")
    kube.wait(lambda: not _children(kube, topics_ns, "restart"), timeout_s=120,
              what="the children to be garbage-collected")
    kube.wait(lambda: not kube.items("pods", topics_ns, selector=f"{TOPIC_LABEL}=restart"),
              timeout_s=120, what="the pods to be gone")
    claims_after = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=restart")
    assert {c["metadata"]["name"] for c in claims_after} == \
        {c["metadata"]["name"] for c in claims_before}


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Webhook endpoint that records (arrival ms, body) of every POST and answers 204."""

    received: list[tuple[int, dict[str, Any]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append((int(time.time() * 1000), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reports what matters."""


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, list[tuple[int, dict[str, Any]]]]]:
    """A local webhook receiver on a free loopback port: (URL, received messages)."""
    received: list[tuple[int, dict[str, Any]]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        thread.join(timeout=10)


def _topic_secret(kube: Kube, namespace: str, topic: str, key: str) -> str:
    """One value of the Secret the operator created for the topic."""
    secret = kube.get("secret", f"{topic}-credentials", namespace)
    assert secret is not None
    return base64.b64decode(secret["data"][key]).decode()


def _topic_credentials(kube: Kube, namespace: str, topic: str) -> tuple[str, str]:
    """(Redis password, API token) from the Secret the operator created for the topic."""
    return (_topic_secret(kube, namespace, topic, "redis-password"),
            _topic_secret(kube, namespace, topic, "api-token"))


def _like_a_broker_pod(kube: Kube, namespace: str, topic: str, port: int) -> None:
    """Give a local redis-server the users a broker pod of the topic starts with: the rules
    from the Redis StatefulSet's environment, the passwords from the topic's Secret."""
    statefulset = kube.get("statefulset", f"{topic}-redis-0", namespace)
    assert statefulset is not None
    env = {item["name"]: item.get("value", "") for item in
           statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    admin_password = _topic_secret(kube, namespace, topic, "redis-admin-password")
    with redis.Redis(port=port) as server:
        server.execute_command("ACL", "SETUSER", env["ADMIN_USER"],
                               *env["ADMIN_USER_RULES"].split(), f">{admin_password}")
        server.execute_command("ACL", "SETUSER", env["SERVICE_USER"],
                               *env["SERVICE_USER_RULES"].split(),
                               f">{_topic_secret(kube, namespace, topic, 'redis-password')}")
        server.config_set("masteruser", env["ADMIN_USER"])
        server.config_set("masterauth", admin_password)
        server.execute_command("ACL", "SETUSER", "default", "off")


def _pod_env_from_secret(kube: Kube, namespace: str, topic: str) -> dict[str, str]:
    """What a delay-service pod's environment takes from the topic's Secret: each
    secretKeyRef of the service StatefulSet resolved the way the kubelet would (an optional
    key the Secret lacks is left out), so the process gets exactly what the operator wires."""
    statefulset = kube.get("statefulset", f"{topic}-service", namespace)
    secret = kube.get("secret", f"{topic}-credentials", namespace)
    assert statefulset is not None
    assert secret is not None
    env: dict[str, str] = {}
    for item in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            continue
        assert ref["name"] == f"{topic}-credentials", ref
        value = secret["data"].get(ref["key"])
        assert value is not None or ref.get("optional"), f"the Secret lacks {ref['key']}"
        if value is not None:
            env[item["name"]] = base64.b64decode(value).decode()
    return env


def _service_url(password: str, port: int) -> str:
    """The broker URL `delayq serve` gets in a pod (topic.json), pointed at a local port."""
    return f"redis://{acl.SERVICE_USER}:{password}@127.0.0.1:{port}/0"


def _start_serve(kube: Kube, namespace: str, topic: str, workdir: Path,
                 broker_url: str, *more_brokers: str) -> tuple[ManagedProcess, str]:
    """``delayq serve`` from the topic's ConfigMap and the Secret's keys its StatefulSet
    names, on a local port, against local brokers (broker 0's URL, then the others').

    Only the broker URLs and the listen address are overridden: pods do not run under KWOK,
    so the process plays the topic's first delay-service pod. Returns it and its base URL.
    """
    config_map = kube.get("configmap", f"{topic}-config", namespace)
    assert config_map is not None
    topic_file = workdir / "topic.json"
    topic_file.write_text(config_map["data"]["topic.json"])
    port = free_port()
    env = {**os.environ, **_pod_env_from_secret(kube, namespace, topic),
           "POD_NAME": f"{topic}-service-0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(
               [str(REPO / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log_path = workdir / f"serve-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-c", "import sys; from delayq.cli import main; sys.exit(main())",
             "serve", "--config", str(topic_file), "--host", "127.0.0.1", "--port", str(port),
             "--redis-url", broker_url, "--broker-urls", ",".join([broker_url, *more_brokers])],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
    serve = ManagedProcess("delayq-serve", popen, log_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200,
                   timeout_s=60, what="delayq serve to be ready", abort=serve.exited,
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
    except Exception:
        print(f"--- delayq serve log tail:\n{serve.tail(30)}")
        serve.stop()  # the caller never gets it: stop it here, not leave it running
        raise
    return serve, base


def _schedule(base: str, topic: str, token: str, message_id: str, delay_ms: int) -> None:
    """POST one message to the topic's HTTP API; any non-2xx answer fails the test."""
    assert 200 <= _schedule_status(base, topic, token, message_id, delay_ms) < 300


def _schedule_status(base: str, topic: str, token: str, message_id: str, delay_ms: int) -> int:
    request = urllib.request.Request(
        f"{base}/v1/topics/{topic}/messages", method="POST",
        data=json.dumps({"id": message_id, "delayMs": delay_ms, "payload": "hello"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def _assert_read_token_reads_only(base: str, topic: str, read_token: str) -> None:
    """The Secret's read-only token, as the pods get it: the overview answers, a write is a
    403 (the dashboard's viewers on Kubernetes)."""
    request = urllib.request.Request(f"{base}/v1/topics/{topic}/overview",
                                     headers={"Authorization": f"Bearer {read_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert _schedule_status(base, topic, read_token, "viewer-write", 1000) == 403


def _received(received: list[tuple[int, dict[str, Any]]],
              message_id: str) -> tuple[int, dict[str, Any]] | None:
    return next(((t, m) for t, m in received if m.get("id") == message_id), None)


def _assert_tree_closed_to_strangers(zookeeper: ZooKeeperServer, namespace: str,
                                     topic: str) -> None:
    """A client without the topic's credentials can read and write none of its nodes."""
    root = f"/delayq/{namespace}/{topic}"
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=30)
    try:
        for node in (f"{root}/routing", f"{root}/assignment", f"{root}/members"):
            with pytest.raises(NoAuthError):
                client.get(node)
            with pytest.raises(NoAuthError):
                client.set(node, b"hijacked")
    finally:
        client.stop()
        client.close()


def test_message_end_to_end_through_the_provisioned_topic(
    kube: Kube, operator: LocalOperator, topics_ns: str, tmp_path_factory: pytest.TempPathFactory,
    webhook_receiver: tuple[str, list[tuple[int, dict[str, Any]]]], zookeeper: ZooKeeperServer,
) -> None:
    """Point 8: schedule through the provisioned topic's API, receive it on the webhook.

    The data plane runs locally (the documented test-only way, pods do not run under KWOK): a
    real redis-server protected by the password from the topic's Secret, and ``delayq serve``
    started from the topic.json the operator wrote into the topic's ConfigMap, with only the
    broker address and listen port overridden to local ones. ZooKeeper routing is the one the
    operator published. The message must arrive, never before its due time. The topic's
    ZooKeeper tree, written by the operator and by the service, is closed to anyone else.
    The Secret's read-only token reads and cannot write.
    """
    url, received = webhook_receiver
    kube.apply(_topic("hooks", slotAmount=16, brokers=1, replicasPerBroker=1,
                      topicType="webhook",
                      delivery={"webhook": {"url": url, "allowPrivateTargets": True,
                                            "allowInsecureHttp": True}}), topics_ns)
    _wait_reconciled(kube, operator, topics_ns, "hooks")
    password, token = _topic_credentials(kube, topics_ns, "hooks")
    workdir = tmp_path_factory.mktemp("dataplane")

    broker = RedisServer().start()
    serve: ManagedProcess | None = None
    try:
        _like_a_broker_pod(kube, topics_ns, "hooks", broker.port)
        serve, base = _start_serve(kube, topics_ns, "hooks", workdir,
                                   _service_url(password, broker.port))
        _assert_tree_closed_to_strangers(zookeeper, topics_ns, "hooks")
        _assert_read_token_reads_only(base, "hooks",
                                      _topic_secret(kube, topics_ns, "hooks", "read-token"))
        _schedule(base, "hooks", token, "e2e-1", delay_ms=2000)
        arrival_ms, message = wait_until(lambda: _received(received, "e2e-1"), timeout_s=60,
                                         what="the message at the webhook receiver",
                                         abort=serve.exited, interval_s=INTERVAL_S,
                                         not_yet=NOT_YET)
        assert message["dueMs"] <= arrival_ms, "delivered before it was due"
        print(f"e2e: message delivered {arrival_ms - message['dueMs']} ms after due")
    except Exception:
        if serve is not None:
            print(f"--- delayq serve log tail:\n{serve.tail(60)}")
        raise
    finally:
        if serve is not None:
            serve.stop()
        broker.stop()


#: The topic status right after the failover test's promotion, for the test that follows it.
_FAILOVER_STATUS: dict[str, Any] = {}


def _admin(port: int, admin_password: str) -> redis.Redis:
    return redis.Redis(port=port, username=acl.ADMIN_USER, password=admin_password)


def _replication(port: int, admin_password: str) -> dict[str, Any]:
    with _admin(port, admin_password) as client:
        info: dict[str, Any] = client.info("replication")
    return info


def test_failover_promotes_the_replica_and_keeps_scheduled_messages(
    kube: Kube, operator: LocalOperator, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
    webhook_receiver: tuple[str, list[tuple[int, dict[str, Any]]]],
) -> None:
    """Point 5: the master pod is deleted; the operator promotes the replica; nothing is lost;
    the old master, back as a master, is demoted (issue 13: Events of failover and demotion).

    Two local redis-servers play the broker's two pods (replica replicating from master) via
    the operator's test-only address map (e2e/operator_main.py). With both answering, the
    topic reaches Ready=True (point 3). A message is scheduled and replicated; then the master
    pod is deleted and its Redis killed. After the failover grace the operator must promote the
    replica (REPLICAOF NO ONE on the right process, role label, status with lastFailoverTime)
    and, once delayq serve runs against the new master, the message is delivered, never early.
    """
    url, received = webhook_receiver
    ns = f"e2e-failover-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    workdir = tmp_path_factory.mktemp("failover")
    addresses = workdir / "addresses.json"
    closed = ["127.0.0.1", free_port()]  # nothing listens: unmapped pods fail fast
    addresses.write_text(json.dumps({"*": closed}))
    op = LocalOperator(
        repo=REPO, kubeconfig=operator.kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log", addresses_file=addresses,
        env_overrides={**_chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_HEALTH_INTERVAL_S": "1", "DELAYQ_FAILOVER_GRACE_S": "3"},
    ).start()
    master, replica, returned = RedisServer(), RedisServer(), RedisServer()
    serve: ManagedProcess | None = None
    try:
        kube.apply(_topic("fo", slotAmount=16, brokers=1, replicasPerBroker=1,
                          topicType="webhook",
                          delivery={"webhook": {"url": url, "allowPrivateTargets": True,
                                            "allowInsecureHttp": True}}), ns)
        _wait_reconciled(kube, op, ns, "fo")
        pods = kube.wait(lambda: _all_pods_running(kube, ns, "fo"), timeout_s=120,
                         what="the topic's pods Running")
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
        password, token = _topic_credentials(kube, ns, "fo")
        master.start()
        replica.start()
        admin_password = _topic_secret(kube, ns, "fo", "redis-admin-password")
        for server in (master, replica):
            _like_a_broker_pod(kube, ns, "fo", server.port)
        with _admin(replica.port, admin_password) as client:
            client.replicaof("127.0.0.1", master.port)
        service_host = f"fo-redis-0.{ns}.svc"
        addresses.write_text(json.dumps({
            "*": closed, ips["fo-redis-0-0"]: ["127.0.0.1", master.port],
            ips["fo-redis-0-1"]: ["127.0.0.1", replica.port],
            service_host: ["127.0.0.1", master.port]}))

        def serving_with(master_pod: str) -> dict[str, Any] | None:
            topic = kube.get("dt", "fo", ns)
            brokers = (topic or {}).get("status", {}).get("brokers") or [{}]
            ok = condition(topic, "Ready") == "True" and brokers[0].get("masterPod") == master_pod
            return topic if ok else None

        kube.wait(lambda: serving_with("fo-redis-0-0"), timeout_s=90,
                  what="Ready=True with fo-redis-0-0 as master")

        serve, base = _start_serve(kube, ns, "fo", workdir,
                                   _service_url(password, master.port))
        _schedule(base, "fo", token, "before-failover", delay_ms=15000)
        wait_until(lambda: _replication(replica.port, admin_password).get("master_link_status")
                   == "up" and _replication(replica.port, admin_password).get("slave_repl_offset")
                   == _replication(master.port, admin_password).get("master_repl_offset"),
                   timeout_s=30, what="the replica to have replicated the message",
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
        serve.stop()
        serve = None

        master.stop()
        kube.kubectl("delete", "pod", "fo-redis-0-0", "-n", ns, "--wait=false")
        addresses.write_text(json.dumps({
            "*": closed, ips["fo-redis-0-1"]: ["127.0.0.1", replica.port],
            service_host: ["127.0.0.1", replica.port]}))
        topic = kube.wait(lambda: serving_with("fo-redis-0-1"), timeout_s=120,
                          what="the replica fo-redis-0-1 promoted and Ready=True")
        _FAILOVER_STATUS.update(topic["status"])
        assert _replication(replica.port, admin_password)["role"] == "master"
        promoted = kube.get("pod", "fo-redis-0-1", ns)
        assert promoted is not None
        assert promoted["metadata"]["labels"].get("delayq.io/redis-role") == "master"
        # What a user sees: the failover in `kubectl describe dt`, once each, and in /metrics.
        described = wait_until(
            lambda: _described_with(kube, ns, "fo", ("FailoverStarted", "FailoverPromoted")),
            timeout_s=30, what="the failover Events in kubectl describe", interval_s=INTERVAL_S,
            not_yet=NOT_YET)
        assert "promoted fo-redis-0-1 to master after fo-redis-0-0 was gone" in described
        events = kube.items("events", ns)
        reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "fo"]
        assert reasons.count("FailoverPromoted") == 1
        assert reasons.count("FailoverStarted") == 1
        assert _operator_metric(op, "delayq_operator_failovers_total",
                                {"topic_namespace": ns, "topic": "fo"}) == 1
        assert _operator_metric(op, "delayq_operator_is_leader", {}) == 1

        serve, base = _start_serve(kube, ns, "fo", workdir,
                                   _service_url(password, replica.port))
        arrival_ms, message = wait_until(lambda: _received(received, "before-failover"),
                                         timeout_s=90, what="the pre-failover message delivered",
                                         abort=serve.exited, interval_s=INTERVAL_S,
                                         not_yet=NOT_YET)
        assert message["dueMs"] <= arrival_ms, "delivered before it was due"

        # The lost master's pod is back (the StatefulSet made it again) and its Redis still
        # acts as a master, as one cut off by a partition would: demoted, told in describe.
        def back() -> dict[str, Any] | None:
            pod = kube.get("pod", "fo-redis-0-0", ns)
            ok = (pod and pod["status"].get("phase") == "Running"
                  and pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp"))
            return pod if ok else None

        returned_ip = kube.wait(back, timeout_s=60, what="fo-redis-0-0 made again")["status"][
            "podIP"]
        returned.start()
        _like_a_broker_pod(kube, ns, "fo", returned.port)
        addresses.write_text(json.dumps({
            "*": closed, ips["fo-redis-0-1"]: ["127.0.0.1", replica.port],
            returned_ip: ["127.0.0.1", returned.port],
            service_host: ["127.0.0.1", replica.port]}))
        described = wait_until(
            lambda: _described_with(kube, ns, "fo", ("StrayMasterDemoted",)),
            timeout_s=30, what="the demotion Event in kubectl describe", interval_s=INTERVAL_S,
            not_yet=NOT_YET)
        assert "fo-redis-0-0 still acted as a master; it now replicates from fo-redis-0-1" \
            in " ".join(described.split())
        assert _replication(returned.port, admin_password)["role"] == "slave"
        assert _replication(replica.port, admin_password)["role"] == "master"
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


def _described_with(kube: Kube, namespace: str, topic: str, reasons: tuple[str, ...]) -> str | None:
    """`kubectl describe dt` once its Events section lists every one of `reasons`."""
    text = kube.kubectl("describe", "dt", topic, "-n", namespace).stdout
    events = text.partition("\nEvents:")[2]
    return text if all(reason in events for reason in reasons) else None


def _operator_metric(op: LocalOperator, name: str, labels: dict[str, str]) -> float | None:
    """One sample of the local operator's /metrics, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{op.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_failover_is_recorded_in_the_status() -> None:
    """Point 5: the promotion after the master's loss is reported as a failover in the status.

    Reads the status the failover test captured right after the promotion.
    """
    assert _FAILOVER_STATUS, "the failover test did not get as far as the promotion"
    broker = _FAILOVER_STATUS["brokers"][0]
    assert broker.get("lastFailoverTime")


#: The chart's leader Lease (its Role allows exactly this name) and the LeaderLeaseTiming defaults.
LEASE_NAME = "delayq-operator"
LEASE_DURATION_S = 15
RETRY_INTERVAL_S = 2


def _lease_holder(kube: Kube, namespace: str) -> str:
    lease = kube.get("lease", LEASE_NAME, namespace)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _replica(name: str, namespace: str, kube: Kube, operator: LocalOperator,
             chart_release: Release, zookeeper: ZooKeeperServer, workdir: Path) -> LocalOperator:
    """One replica of the chart's Deployment, as a local process: it campaigns for the Lease."""
    return LocalOperator(
        repo=REPO, kubeconfig=operator.kubeconfig, namespaces=[namespace],
        log_path=workdir / f"{name}.log", standalone=False,
        env_overrides={**_chart_env(kube, chart_release, zookeeper), "POD_NAME": name,
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    )


def test_one_leader_reconciles_and_a_standby_takes_over_after_kill_9(
    kube: Kube, operator: LocalOperator, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two replicas: exactly one holds the Lease and reconciles; SIGKILL it and the other
    reconciles the next change within the lease duration plus a few seconds."""
    ns = f"e2e-leader-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    workdir = tmp_path_factory.mktemp("leader")
    replicas = {name: _replica(name, ns, kube, operator, chart_release, zookeeper, workdir)
                for name in ("op-a", "op-b")}
    try:
        for replica in replicas.values():
            replica.start()
        holder = kube.wait(lambda: _lease_holder(kube, chart_release.namespace), timeout_s=60,
                           what="one replica to hold the leader Lease")
        leader_name = holder.rsplit("_", 1)[0]
        (standby_name,) = set(replicas) - {leader_name}
        leader, standby = replicas[leader_name], replicas[standby_name]

        kube.apply(_topic("elected", slotAmount=16, brokers=1), ns)
        _wait_reconciled(kube, leader, ns, "elected")
        # kopf logs the handler's success after the status patch the wait above saw: the log
        # line may come a moment later
        kube.wait(lambda: "Handler 'reconcile' succeeded" in leader.log_path.read_text(),
                  timeout_s=30, what="the leader's log to record the reconcile's success")
        standby_log = standby.log_path.read_text()
        assert "campaigning for the lease" in standby_log
        assert "Handler" not in standby_log, "the standby ran a kopf handler"
        assert _lease_holder(kube, chart_release.namespace) == holder

        leader.kill()
        killed = time.monotonic()
        kube.apply(_topic("elected", slotAmount=16, brokers=2), ns)
        _wait_reconciled(kube, standby, ns, "elected",
                         timeout=LEASE_DURATION_S + RETRY_INTERVAL_S + 60)
        takeover_s = time.monotonic() - killed
        print(f"e2e: after kill -9 of the leader, the standby reconciled in {takeover_s:.1f}s")
        assert _lease_holder(kube, chart_release.namespace).startswith(f"{standby_name}_")
        assert takeover_s <= LEASE_DURATION_S + RETRY_INTERVAL_S + 8
        assert len(_redis_statefulsets(kube, ns, "elected")) == 2
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
    kube: Kube, operator: LocalOperator, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Point 6: with every operator killed -9, deleting a topic and then its namespace
    completes (no finalizer: owner references and the StatefulSets' volume claim retention
    policy clean up); a restarted operator garbage-collects the topics' ZooKeeper trees. The
    finalizer of an older operator version is removed by the first operator that sees it."""
    ns = f"e2e-nsdel-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    workdir = tmp_path_factory.mktemp("operator-nsdel")
    first = _replica("op-first", ns, kube, operator, chart_release, zookeeper, workdir).start()
    restarted: LocalOperator | None = None
    try:
        legacy = _topic("legacy", brokers=1)
        legacy["metadata"]["finalizers"] = ["delayq.io/finalizer", "example.com/keep"]
        kube.apply(legacy, ns)
        kube.wait(lambda: (kube.get("dt", "legacy", ns) or {})["metadata"].get("finalizers")
                  == ["example.com/keep"], timeout_s=60, what="the old finalizer to be removed")
        kube.kubectl("patch", "dt", "legacy", "-n", ns, "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}')
        kube.apply(_topic("doomed", brokers=1, deletionPolicy="Delete"), ns)
        kube.apply(_topic("bystander", brokers=1), ns)
        for name in ("doomed", "bystander"):
            _wait_reconciled(kube, first, ns, name)
            assert _tree_exists(zookeeper, ns, name)
        kube.wait(lambda: _all_pods_running(kube, ns, "doomed"), timeout_s=120,
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
        restarted = _replica("op-restarted", ns, kube, operator, chart_release,
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
