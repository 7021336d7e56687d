"""The product on real pods: the chart's operator, ZooKeeper and every topic pod run on a real
kubelet from the locally built images, with no test-only address map anywhere in the path.

The real node (e2e/harness/node.py) is tainted; the release puts the operator, ZooKeeper and the
topics' pods on it through the chart's own placement values (``operator``/``zookeeper``/
``topics`` ``nodeSelector`` and ``tolerations``), the way a platform team keeps delayq on a node
pool. The tests of this module share one release and one tenant namespace and run in order:
install, a topic, traffic, faults, upgrade, growth, teardown.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import workloads
from e2e.harness.control_plane import volume_phases
from e2e.harness.kube import Kube, condition
from e2e.harness.metrics import samples
from e2e.harness.node import REAL_NODE, RealNode
from e2e.harness.operator import lease_holder
from e2e.harness.real_release import CHART, SERVICE_CIDR, Install, install_release
from e2e.harness.topics import delay_topic

RELEASE = "dq"
FULLNAME = "dq-delayq"

#: The delay-service's HTTP port (API and /metrics) and the operator's metrics port (chart
#: default operator.metrics.port).
SERVICE_PORT = 8080
OPERATOR_METRICS_PORT = 8081

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def install(kube: Kube, real_node: RealNode) -> Iterator[Install]:
    """Scenario 1's ``helm install --wait`` of charts/delayq with the local images."""
    installed = install_release(kube, real_node, RELEASE, "e2e-real")
    yield installed
    namespace, tenant = installed.namespace, installed.tenant
    if kube.helm("status", RELEASE, "--namespace", namespace, check=False).returncode == 0:
        kube.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m",
                  timeout=240)
    for name in (tenant, namespace):
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _pods(kube: Kube, namespace: str, selector: str) -> list[dict[str, Any]]:
    return kube.items("pods", namespace, selector)


def _ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready") == "True"


def test_helm_install_runs_the_operator_and_zookeeper_on_the_real_node(
    kube: Kube, install: Install
) -> None:
    """Scenario 1: both operator replicas Running and Ready through their real probes, on the
    real node; exactly one holds the leader Lease; the bundled ZooKeeper runs its real image
    and answers its probe; `helm test` (a pod scraping the operator's metrics) passes."""
    operators = _pods(kube, install.namespace, "app.kubernetes.io/component=operator")
    assert len(operators) == 2
    for pod in operators:
        assert pod["spec"]["nodeName"] == REAL_NODE
        assert _ready(pod), pod["status"]
        assert pod["spec"]["containers"][0]["image"] == install.image
    names = {pod["metadata"]["name"] for pod in operators}
    lease = kube.wait(lambda: lease_holder(kube, install.namespace), timeout_s=60,
                      what="a leader in the Lease")
    assert lease.rsplit("_", 1)[0] in names  # <pod>_<random>: one process of one replica
    (zookeeper,) = _pods(kube, install.namespace, "app.kubernetes.io/component=zookeeper")
    assert zookeeper["spec"]["nodeName"] == REAL_NODE
    assert _ready(zookeeper)
    result = kube.helm("test", RELEASE, "--namespace", install.namespace, "--timeout", "3m",
                       timeout=240)
    assert "Phase:          Succeeded" in result.stdout, result.stdout


def _wait_topic_ready(kube: Kube, namespace: str, name: str, timeout_s: float = 300) -> None:
    start = time.monotonic()
    kube.wait(lambda: condition(kube.get("dt", name, namespace), "Ready") == "True",
              timeout_s=timeout_s, what=f"DelayTopic {name} Ready=True")
    print(f"e2e: topic {name} Ready in {time.monotonic() - start:.1f}s")


@pytest.fixture(scope="module")
def webhook_topic(kube: Kube, install: Install) -> str:
    """Scenario 2: a webhook topic of 2 brokers x (master + 1 replica) with a receiver
    Deployment in the tenant's namespace; Ready=True from the in-cluster operator."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    kube.apply({"apiVersion": "v1", "kind": "List",
                "items": workloads.receiver(install.tenant, install.image, secret)})
    url = f"http://receiver.{install.tenant}.svc.cluster.local/hook"
    signing = {"name": workloads.SIGNING_SECRET, "key": workloads.SIGNING_SECRET}
    kube.apply(delay_topic("hooks", slotAmount=16, brokers=2, replicasPerBroker=1,
                           topicType="webhook",
                           delivery={"webhook": {"url": url, "allowInsecureHttp": True,
                                                 "allowedCidrs": [SERVICE_CIDR],
                                                 "signingSecretRef": signing}}),
               install.tenant)
    _wait_topic_ready(kube, install.tenant, "hooks")
    _wait_pods_ready(kube, install.tenant, "app=receiver", 1)
    return "hooks"


def _explain(kube: Kube, namespace: str, pods: list[dict[str, Any]]) -> str:
    """What kubectl says about pods that are not Ready (their events and their logs), about
    the namespace's unbound claims and the volume pool."""
    parts = []
    for pod in pods:
        if _ready(pod):
            continue
        name = pod["metadata"]["name"]
        parts.append(kube.kubectl("describe", "pod", name, "-n", namespace, check=False).stdout)
        parts.append(kube.kubectl("logs", name, "-n", namespace, "--all-containers",
                                  "--tail=30", check=False).stdout)
    for claim in kube.items("pvc", namespace):
        if claim.get("status", {}).get("phase") != "Bound":
            parts.append(kube.kubectl("describe", "pvc", claim["metadata"]["name"], "-n",
                                      namespace, check=False).stdout)
    parts.append(f"volume pool: {volume_phases(kube)}")
    return "\n".join(parts)


def _wait_pods_ready(kube: Kube, namespace: str, selector: str, count: int,
                     timeout_s: float = 180) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        pods = _pods(kube, namespace, selector)
        return pods if len(pods) == count and all(map(_ready, pods)) else None

    try:
        return kube.wait(ready, timeout_s=timeout_s, what=f"{count} pods {selector} Ready")
    except TimeoutError:
        print(_explain(kube, namespace, _pods(kube, namespace, selector)))
        raise


def test_a_webhook_topic_becomes_ready_on_real_pods(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 2: every Redis and delay-service pod runs on the real node and is Ready
    through its real probes (the service's readiness needs its slots owned)."""
    start = time.monotonic()
    pods = _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={webhook_topic}", 2 * 2 + 2)
    print(f"e2e: every topic pod Ready {time.monotonic() - start:.1f}s after Ready=True")
    assert {pod["spec"]["nodeName"] for pod in pods} == {REAL_NODE}


def _received(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    """Every delivery the receiver logged, by id (the first arrival of each)."""
    logs = kube.kubectl("logs", "deployment/receiver", "-n", namespace, "--tail=-1").stdout
    deliveries: dict[str, dict[str, Any]] = {}
    for entry in workloads.json_lines(logs):
        deliveries.setdefault(entry["id"], entry)
    return deliveries


def _produce(kube: Kube, install: Install, topic: str, name: str, count: int,
             start_ms: int = 3000, spread_ms: int = 3000) -> None:
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.producer(
        install.tenant, install.image, topic, name, count, start_ms, spread_ms)})
    try:
        kube.wait(lambda: (kube.get("job", name, install.tenant) or {})
                  .get("status", {}).get("succeeded") == 1, timeout_s=180,
                  what=f"producer job {name} to finish")
    except TimeoutError:
        print(_explain(kube, install.tenant, _pods(kube, install.tenant, f"job-name={name}")))
        raise


SLOTS_NEEDING_ATTENTION = (
    "import os, urllib.request; print(urllib.request.urlopen(urllib.request.Request("
    "'http://127.0.0.1:8080/v1/topics/{topic}/slots?only=attention', headers={{"
    "'Authorization': 'Bearer ' + os.environ['DELAYQ_API_TOKEN']}})).read().decode())")


MESSAGE_STATE = (
    "import os, urllib.request, urllib.error\ntry:\n print(urllib.request.urlopen("
    "urllib.request.Request('http://127.0.0.1:8080/v1/topics/{topic}/messages/{id}', "
    "headers={{'Authorization': 'Bearer ' + os.environ['DELAYQ_API_TOKEN']}})).read().decode())"
    "\nexcept urllib.error.HTTPError as e:\n print(e.code, e.read().decode())")


#: GET a path of a pod's own HTTP server (argv: port, path) with the topic's token when the pod
#: has one (a delay-service pod; the operator's /metrics is open), printing the body.
HTTP_GET = (
    "import os, sys, urllib.request\n"
    "token = os.environ.get('DELAYQ_API_TOKEN')\n"
    "headers = {'Authorization': 'Bearer ' + token} if token else {}\n"
    "url = f'http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}'\n"
    "print(urllib.request.urlopen(urllib.request.Request(url, headers=headers)).read().decode())")


def _in_pod(kube: Kube, namespace: str, pod: str, script: str, *args: str,
            timeout: float = 60) -> str:
    """The standard output of ``python3 -c script args...`` run in ``pod``'s container."""
    return kube.kubectl("exec", pod, "-n", namespace, "--", "python3", "-c", script, *args,
                        timeout=timeout).stdout


def _samples(kube: Kube, namespace: str, pod: str, port: int,
             name: str) -> list[tuple[dict[str, str], float]]:
    """The samples called ``name`` (e.g. ``delayq_scheduled_total``) of ``pod``'s /metrics."""
    return samples(_in_pod(kube, namespace, pod, HTTP_GET, str(port), "/metrics"), name)


def _wait_delivered(kube: Kube, namespace: str, topic: str, ids: list[str],
                    timeout_s: float = 120) -> dict[str, dict[str, Any]]:
    """Every one of ``ids`` at the receiver; on a timeout, the service pods' logs explain."""
    def arrived() -> dict[str, dict[str, Any]] | None:
        deliveries = _received(kube, namespace)
        return deliveries if all(i in deliveries for i in ids) else None

    try:
        return kube.wait(arrived, timeout_s=timeout_s, what=f"{len(ids)} messages delivered")
    except TimeoutError:
        missing = [i for i in ids if i not in _received(kube, namespace)]
        print(f"{len(missing)} missing, e.g. {missing[:5]}")
        for message_id in missing[:3]:  # what the topic says of them
            print(kube.kubectl("exec", f"{topic}-service-0", "-n", namespace, "--", "python3",
                               "-c", MESSAGE_STATE.format(topic=topic, id=message_id),
                               check=False))
        for pod in _pods(kube, namespace, f"delayq.io/topic={topic}"):
            name = pod["metadata"]["name"]
            print(f"--- {name}:\n" + kube.kubectl(
                "logs", name, "-n", namespace, "--tail=15", check=False).stdout)
            if "-service-" in name:  # its own view: stalled or unowned slots, counters
                print(kube.kubectl("exec", name, "-n", namespace, "--", "python3", "-c",
                                   SLOTS_NEEDING_ATTENTION.format(topic=topic),
                                   check=False).stdout)
        print(kube.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp",
                           check=False).stdout)
        print(kube.kubectl("get", "dt", topic, "-n", namespace, "-o", "yaml",
                           check=False).stdout)
        raise


def _lateness_ms(deliveries: dict[str, dict[str, Any]], ids: list[str]) -> list[float]:
    return sorted(deliveries[i]["atMs"] - deliveries[i]["dueMs"] for i in ids)


def _schedule_counts(kube: Kube, namespace: str, topic: str) -> tuple[float, float]:
    """Over the topic's delay-service pods: messages created by schedule calls, and the
    answered `POST .../messages/batch` requests (every code)."""
    created = batches = 0.0
    for pod in _pods(kube, namespace, f"delayq.io/topic={topic},"
                     "app.kubernetes.io/component=delay-service"):
        name = pod["metadata"]["name"]
        created += sum(value for labels, value in _samples(
            kube, namespace, name, SERVICE_PORT, "delayq_scheduled_total")
            if labels.get("result") == "created")
        batches += sum(value for labels, value in _samples(
            kube, namespace, name, SERVICE_PORT, "delayq_http_request_duration_seconds_count")
            if labels.get("method") == "POST" and labels["route"].endswith("/messages/batch"))
    return created, batches


def test_messages_from_a_client_pod_are_delivered_on_time_to_the_receiver(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 3: 300 messages scheduled through the topic's Service from a producer Job
    reach the receiver Deployment, each once at least, none before its due time; the
    delay-service pods' /metrics count them (`delayq_scheduled_total{result="created"}`) and
    the producer's batch requests (`delayq_http_request_duration_seconds`)."""
    before = _schedule_counts(kube, install.tenant, webhook_topic)
    _produce(kube, install, webhook_topic, "burst", 300)
    ids = [f"burst-{i}" for i in range(300)]
    deliveries = _wait_delivered(kube, install.tenant, webhook_topic, ids)
    assert all(deliveries[i]["verified"] for i in ids), "a signature the receiver refused"
    lateness = _lateness_ms(deliveries, ids)
    assert lateness[0] >= 0, f"delivered early by {-lateness[0]:.1f} ms"
    p50, p99 = lateness[len(lateness) // 2], lateness[int(len(lateness) * 0.99)]
    print(f"e2e: real-pod webhook lateness over {len(ids)} messages: p50 {p50:.1f} ms, "
          f"p99 {p99:.1f} ms, max {lateness[-1]:.1f} ms")
    # read once every message is delivered: the reads (a python3 process started in each
    # service pod) must not compete with the deliveries whose lateness is measured
    created, batches = (after - first for after, first in zip(
        _schedule_counts(kube, install.tenant, webhook_topic), before, strict=True))
    print(f"e2e: the service pods counted {created:g} created, {batches:g} batch requests")
    assert created == 300
    assert batches >= 2  # 300 messages in batches of at most 200, plus any resent


def _container_id(kube: Kube, namespace: str, pod: str) -> str:
    status = (kube.get("pod", pod, namespace) or {}).get("status", {})
    container_id: str = status["containerStatuses"][0]["containerID"]
    return container_id


def _master_pod(kube: Kube, namespace: str, topic: str, broker: int) -> str:
    brokers = (kube.get("dt", topic, namespace) or {}).get("status", {}).get("brokers") or []
    master: str = brokers[broker]["masterPod"]
    return master


def test_kill_9_of_a_redis_master_loses_nothing(
    kube: Kube, install: Install, webhook_topic: str, real_node: RealNode
) -> None:
    """Scenario 4: the master Redis process of broker 0 is killed with SIGKILL from the host
    while 200 messages wait; kubelet restarts it (or the operator promotes its replica) and
    every message is delivered, none early."""
    _produce(kube, install, webhook_topic, "redis-kill", 200, start_ms=8000, spread_ms=6000)
    master = _master_pod(kube, install.tenant, webhook_topic, 0)
    pid = real_node.kill_container(_container_id(kube, install.tenant, master))
    print(f"e2e: killed redis-server (pid {pid}) of {master}")
    ids = [f"redis-kill-{i}" for i in range(200)]
    deliveries = _wait_delivered(kube, install.tenant, webhook_topic, ids, timeout_s=180)
    assert _lateness_ms(deliveries, ids)[0] >= 0
    _wait_topic_ready(kube, install.tenant, webhook_topic)


def test_kill_9_of_a_delay_service_loses_nothing(
    kube: Kube, install: Install, webhook_topic: str, real_node: RealNode
) -> None:
    """Scenario 5: a delay-service process is killed with SIGKILL; its slots are taken over
    (by its restart or by the other member) and every message is delivered, none early."""
    _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={webhook_topic}", 6)
    _produce(kube, install, webhook_topic, "service-kill", 200, start_ms=5000, spread_ms=8000)
    pid = real_node.kill_container(
        _container_id(kube, install.tenant, f"{webhook_topic}-service-0"))
    print(f"e2e: killed delayq serve (pid {pid}) of {webhook_topic}-service-0")
    ids = [f"service-kill-{i}" for i in range(200)]
    deliveries = _wait_delivered(kube, install.tenant, webhook_topic, ids, timeout_s=180)
    assert _lateness_ms(deliveries, ids)[0] >= 0


#: "... took over as master at replication offset N, writes paused P ms." (handlers/switchover.py)
PAUSED_MS = re.compile(r"writes paused (\d+) ms")


def _switchover_events(kube: Kube, namespace: str, topic: str) -> list[dict[str, Any]]:
    return [event for event in kube.items("events", namespace)
            if event["involvedObject"]["name"] == topic and event["reason"] == "SwitchedOver"]


def test_deleting_a_redis_master_pod_switches_over_before_it_stops(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """The planned switchover (issue 13) on real pods: `kubectl delete pod` of broker 0's
    master runs its preStop hook, which holds redis-server until the operator has handed the
    role to the caught-up replica (a `SwitchedOver` Event with the write pause), so the
    master changes without waiting failoverGraceSeconds. Messages stored before and written
    right after are all delivered, none early, and the deleted pod rejoins as a replica."""
    topic = webhook_topic
    _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={topic}", 6)
    _wait_topic_ready(kube, install.tenant, topic)
    old_master = _master_pod(kube, install.tenant, topic, 0)
    (replica,) = {f"{topic}-redis-0-0", f"{topic}-redis-0-1"} - {old_master}
    before = len(_switchover_events(kube, install.tenant, topic))
    _produce(kube, install, topic, "before-switch", 200, start_ms=10000, spread_ms=6000)
    start = time.monotonic()
    kube.kubectl("delete", "pod", old_master, "-n", install.tenant, "--wait=false")
    kube.wait(lambda: _master_pod(kube, install.tenant, topic, 0) == replica or None,
              timeout_s=60, what=f"{replica} master of broker 0")
    print(f"e2e: broker 0's master moved {old_master} -> {replica} "
          f"{time.monotonic() - start:.1f}s after the pod delete")
    events = kube.wait(lambda: _switchover_events(kube, install.tenant, topic)[before:] or None,
                       timeout_s=30, what="a SwitchedOver Event")
    paused = PAUSED_MS.search(events[-1]["message"])
    assert paused, events[-1]["message"]
    print(f"e2e: real-pod switchover paused writes {paused[1]} ms ({events[-1]['message']})")
    _produce(kube, install, topic, "after-switch", 100, start_ms=3000, spread_ms=3000)
    ids = [f"before-switch-{i}" for i in range(200)] + [f"after-switch-{i}" for i in range(100)]
    deliveries = _wait_delivered(kube, install.tenant, topic, ids, timeout_s=180)
    assert _lateness_ms(deliveries, ids)[0] >= 0
    _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={topic}", 6)
    _wait_topic_ready(kube, install.tenant, topic)
    assert _master_pod(kube, install.tenant, topic, 0) == replica


def _consumed_on_time(kube: Kube, install: Install, job: str, ids: list[str],
                      what: str) -> None:
    """Waits for the consumer Job ``job``, then checks that it logged every one of ``ids``,
    none before its due time, and prints the lateness."""
    try:
        kube.wait(lambda: (kube.get("job", job, install.tenant) or {})
                  .get("status", {}).get("succeeded") == 1, timeout_s=180,
                  what=f"the consumer job {job} to see every message")
    except TimeoutError:
        print(_explain(kube, install.tenant, _pods(kube, install.tenant, f"job-name={job}")))
        raise
    logs = kube.kubectl("logs", f"job/{job}", "-n", install.tenant, "--tail=-1").stdout
    consumed = {entry["id"]: entry for entry in workloads.json_lines(logs) if "id" in entry}
    assert all(i in consumed for i in ids), [i for i in ids if i not in consumed][:5]
    lateness = _lateness_ms(consumed, ids)
    assert lateness[0] >= 0, f"{what} early by {-lateness[0]:.1f} ms"
    print(f"e2e: real-pod {what} lateness over {len(ids)} messages: "
          f"p50 {lateness[len(ids) // 2]:.1f} ms, p99 {lateness[int(len(ids) * 0.99)]:.1f} ms, "
          f"max {lateness[-1]:.1f} ms")


def test_a_pull_topic_is_consumed_by_a_client_pod(kube: Kube, install: Install) -> None:
    """Scenario 6 (pull): a pull topic's messages, scheduled by a producer Job, are leased and
    acked over HTTP by a consumer Job through the topic's Service, none before its due time."""
    kube.apply(delay_topic("jobs", slotAmount=16, brokers=1, replicasPerBroker=0,
                           topicType="pull"), install.tenant)
    _wait_topic_ready(kube, install.tenant, "jobs")
    _wait_pods_ready(kube, install.tenant, "delayq.io/topic=jobs", 2)
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.pull_consumer(
        install.tenant, install.image, "jobs", "pull-consumer", 200)})
    _produce(kube, install, "jobs", "pulled", 200, start_ms=3000, spread_ms=3000)
    _consumed_on_time(kube, install, "pull-consumer", [f"pulled-{i}" for i in range(200)],
                      "pull (leased)")


def test_a_stream_topic_is_consumed_by_a_consumer_pod(kube: Kube, install: Install) -> None:
    """Scenario 6 (stream): a stream topic written to its own broker 0, its consumer pods named
    in networkPolicy.allowFrom; a consumer Job logged in with the topic's reader Secret (the
    operator's read-only Redis user) reads the target stream through a consumer group and acks
    each entry: every scheduled message arrives, none before its due time."""
    consumers = {"podSelector": {"matchLabels": workloads.STREAM_CONSUMER_LABELS}}
    kube.apply(delay_topic("events", slotAmount=16, brokers=1, replicasPerBroker=0,
                           topicType="stream", networkPolicy={"allowFrom": [consumers]}),
               install.tenant)
    _wait_topic_ready(kube, install.tenant, "events")
    _wait_pods_ready(kube, install.tenant, "delayq.io/topic=events", 2)
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.stream_consumer(
        install.tenant, install.image, "events", f"dq-out:{install.tenant}/events",
        "stream-consumer", 200)})
    _produce(kube, install, "events", "streamed", 200, start_ms=3000, spread_ms=3000)
    _consumed_on_time(kube, install, "stream-consumer", [f"streamed-{i}" for i in range(200)],
                      "stream (read)")


#: Schedules messages of PAYLOAD_BYTES through the pod's own API until one is refused (argv:
#: topic, payload bytes, delayMs, most); prints the stored ids and the refusal.
FILL_UNTIL_REFUSED = """
import json, os, sys, urllib.error, urllib.request
topic, payload_bytes, delay_ms, most = sys.argv[1], *map(int, sys.argv[2:])
headers = {"Authorization": "Bearer " + os.environ["DELAYQ_API_TOKEN"],
           "Content-Type": "application/json"}
url = f"http://127.0.0.1:8080/v1/topics/{topic}/messages"
payload, stored, refusal = "x" * payload_bytes, [], None
for i in range(most):
    body = json.dumps({"id": f"full-{i}", "delayMs": delay_ms, "payload": payload}).encode()
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30)
    except urllib.error.HTTPError as error:
        refusal = {"code": error.code, "retryAfter": error.headers.get("Retry-After"),
                   "error": json.load(error).get("error")}
        break
    stored.append(f"full-{i}")
print(json.dumps({"stored": stored, "refusal": refusal}))
"""

#: Leases and acks due messages through the pod's own API until COUNT were seen or 90 s
#: passed (argv: topic, count), then schedules one more; prints the leased ids and its status.
LEASE_ALL_THEN_SCHEDULE = """
import json, os, sys, time, urllib.request
topic, count = sys.argv[1], int(sys.argv[2])
headers = {"Authorization": "Bearer " + os.environ["DELAYQ_API_TOKEN"],
           "Content-Type": "application/json"}
def call(path, body):
    request = urllib.request.Request(f"http://127.0.0.1:8080/v1/topics/{topic}{path}",
                                     data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.load(response)
seen, deadline = set(), time.monotonic() + 90
while len(seen) < count and time.monotonic() < deadline:
    leases = call("/leases", {"max": 20, "ackTimeoutMs": 30000, "waitMs": 1000})[1]["leases"]
    seen.update(lease["id"] for lease in leases)
    if leases:
        call("/leases/ack", {"tokens": [lease["token"] for lease in leases]})
status = call("/messages", {"id": "after-full", "delayMs": 600000, "payload": "small"})[0]
print(json.dumps({"leased": sorted(seen), "scheduledAfter": status}))
"""

#: The memory guard's figures: the Redis container's limit and the payload that fills it.
FULL_LIMIT = "64Mi"
FULL_MAXMEMORY_BYTES = 64 * 1024 * 1024 * 80 // 100  # builders/redis.py MAXMEMORY_PERCENT
FULL_PAYLOAD_BYTES = 256 * 1024
BROKER_MEMORY_GAUGES = ("delayq_operator_broker_used_memory_bytes",
                        "delayq_operator_broker_max_memory_bytes")


def _leader_pod(kube: Kube, install: Install) -> str:
    return lease_holder(kube, install.namespace).rsplit("_", 1)[0]


def _broker_memory(kube: Kube, install: Install, topic: str) -> dict[str, float]:
    """The leader's `delayq_operator_broker_{used,max}_memory_bytes` of broker 0 of ``topic``,
    by `used` and `max`."""
    text = _in_pod(kube, install.namespace, _leader_pod(kube, install), HTTP_GET,
                   str(OPERATOR_METRICS_PORT), "/metrics")
    return {name.split("_")[3]: value for name in BROKER_MEMORY_GAUGES
            for labels, value in samples(text, name)
            if labels.get("topic") == topic and labels.get("broker") == "0"}


def test_a_full_broker_refuses_with_429_and_keeps_what_it_stored(
    kube: Kube, install: Install
) -> None:
    """The memory guard on real pods (issue 13): a pull topic whose Redis container has a
    64Mi limit (maxmemory 80 % of it, noeviction) is filled through the API until schedule
    answers 429 with Retry-After; the topic shows `BrokerFull`, the operator's broker memory
    gauges the full broker; every stored message is still leased and acked (none lost), after
    which a schedule is accepted again and `BrokerFull` turns False."""
    memory = {"requests": {"cpu": "50m", "memory": FULL_LIMIT}, "limits": {"memory": FULL_LIMIT}}
    kube.apply(delay_topic("full", slotAmount=16, brokers=1, replicasPerBroker=0,
                           topicType="pull", redis={"resources": memory}), install.tenant)
    try:
        _wait_topic_ready(kube, install.tenant, "full")
        _wait_pods_ready(kube, install.tenant, "delayq.io/topic=full", 2)
        start = time.monotonic()
        filled = json.loads(_in_pod(kube, install.tenant, "full-service-0", FILL_UNTIL_REFUSED,
                                    "full", str(FULL_PAYLOAD_BYTES), "10000", "1000"))
        stored, refusal = filled["stored"], filled["refusal"]
        print(f"e2e: a {FULL_LIMIT} broker refused message {len(stored) + 1} of "
              f"{FULL_PAYLOAD_BYTES // 1024} KiB after {time.monotonic() - start:.1f}s: {refusal}")
        assert refusal is not None, f"{len(stored)} messages stored, none refused"
        assert refusal["code"] == 429
        assert int(refusal["retryAfter"] or 0) > 0
        assert "broker is full" in refusal["error"]
        assert len(stored) * FULL_PAYLOAD_BYTES <= FULL_MAXMEMORY_BYTES

        def full_condition(status: str) -> dict[str, Any] | None:
            conditions = (kube.get("dt", "full", install.tenant) or {}).get(
                "status", {}).get("conditions", [])
            return next((c for c in conditions if c["type"] == "BrokerFull"
                         and c["status"] == status), None)

        full = kube.wait(lambda: full_condition("True"), timeout_s=30,
                         what="BrokerFull=True on the topic")
        print(f"e2e: BrokerFull {full['reason']}: {full['message']}")

        def gauged_full() -> dict[str, float] | None:
            figures = _broker_memory(kube, install, "full")
            return figures if figures.get("used", 0) >= 0.9 * FULL_MAXMEMORY_BYTES else None

        figures = kube.wait(gauged_full, timeout_s=30,
                            what="the leader's broker memory gauges of the full broker")
        print(f"e2e: the leader gauges broker 0 at {figures['used']:.0f} of "
              f"{figures['max']:.0f} bytes")
        assert figures["max"] == FULL_MAXMEMORY_BYTES

        start = time.monotonic()
        drained = json.loads(_in_pod(kube, install.tenant, "full-service-0",
                                     LEASE_ALL_THEN_SCHEDULE, "full", str(len(stored)),
                                     timeout=150))
        print(f"e2e: the full broker's {len(drained['leased'])} messages (due 10 s after "
              f"they were stored) leased and acked in {time.monotonic() - start:.1f}s, then a "
              f"schedule answered {drained['scheduledAfter']}")
        assert drained["leased"] == sorted(stored), "a stored message was lost"
        assert drained["scheduledAfter"] in (200, 201)
        kube.wait(lambda: full_condition("False"), timeout_s=30,
                  what="BrokerFull=False once the messages were acked")
    finally:
        kube.kubectl("delete", "dt", "full", "-n", install.tenant, "--wait=false")


def test_helm_upgrade_to_a_new_tag_rolls_everything_and_delivers_what_waits(
    kube: Kube, install: Install, webhook_topic: str, real_node: RealNode
) -> None:
    """Scenario 7: `helm upgrade` to a new image tag rolls the operator Deployment and, through
    the operator, the topic's delay-service pods; messages pending across it all arrive."""
    _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={webhook_topic}", 6)
    new_image = f"{install.image}-upgrade"
    real_node.tag_image(install.image, new_image)
    _produce(kube, install, webhook_topic, "upgrade", 200, start_ms=15000, spread_ms=15000)
    tag = new_image.rsplit(":", 1)[1]
    start = time.monotonic()
    kube.helm("upgrade", RELEASE, str(CHART), "--namespace", install.namespace,
              "--reuse-values", "--set", f"image.tag={tag}", "--wait", "--timeout", "5m",
              timeout=360)

    def rolled() -> bool:
        operators = _pods(kube, install.namespace, "app.kubernetes.io/component=operator")
        services = _pods(kube, install.tenant,
                         f"delayq.io/topic={webhook_topic},app.kubernetes.io/component="
                         "delay-service")
        pods = operators + services
        return len(operators) == 2 and len(services) == 2 and all(
            pod["spec"]["containers"][0]["image"] == new_image and _ready(pod)
            and not pod["metadata"].get("deletionTimestamp") for pod in pods)

    kube.wait(rolled, timeout_s=300, what="operator and delay-service pods on the new image")
    print(f"e2e: helm upgrade rolled operator and topic pods in {time.monotonic() - start:.1f}s")
    ids = [f"upgrade-{i}" for i in range(200)]
    deliveries = _wait_delivered(kube, install.tenant, webhook_topic, ids, timeout_s=180)
    assert _lateness_ms(deliveries, ids)[0] >= 0


def test_a_topic_grows_to_2_brokers_and_32_slots_on_real_pods(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 9 (issue 16): a topic of 1 broker and 16 slots with 200 messages waiting grows
    to 2 brokers and 32 slots in one change while a producer Job keeps scheduling. The
    in-cluster operator doubles the slots, then moves half of them to the new broker; every
    message (before, during, after) reaches the receiver, none early, and the topic ends with
    16 slots on each broker. Its pods are deleted at the end."""
    url = f"http://receiver.{install.tenant}.svc.cluster.local/hook"
    signing = {"name": workloads.SIGNING_SECRET, "key": workloads.SIGNING_SECRET}
    kube.apply(delay_topic("grow", slotAmount=16, brokers=1, replicasPerBroker=0,
                           topicType="webhook",
                           delivery={"webhook": {"url": url, "allowInsecureHttp": True,
                                                 "allowedCidrs": [SERVICE_CIDR],
                                                 "signingSecretRef": signing}}),
               install.tenant)

    def grown() -> dict[str, Any] | None:
        topic = kube.get("dt", "grow", install.tenant) or {}
        status = topic.get("status", {})
        slots = [broker.get("slots") for broker in status.get("brokers", [])]
        done = condition(topic, "Resharding") == "False"
        return status if done and status.get("appliedSlotAmount") == 32 and slots == [16, 16] \
            else None

    try:
        _wait_topic_ready(kube, install.tenant, "grow")
        _produce(kube, install, "grow", "grow-before", 200, start_ms=20000, spread_ms=20000)
        start = time.monotonic()
        kube.kubectl("patch", "dt", "grow", "-n", install.tenant, "--type", "merge",
                     "-p", '{"spec":{"slotAmount":32,"brokers":2}}')
        _produce(kube, install, "grow", "grow-during", 100, start_ms=3000, spread_ms=10000)
        kube.wait(grown, timeout_s=300, what="the topic doubled to 32 slots, 16 on each broker")
        print(f"e2e: 1 -> 2 brokers and 16 -> 32 slots on real pods in "
              f"{time.monotonic() - start:.1f}s")
        _produce(kube, install, "grow", "grow-after", 100, start_ms=2000, spread_ms=3000)
        ids = [f"grow-before-{i}" for i in range(200)] + [
            f"grow-{when}-{i}" for when in ("during", "after") for i in range(100)]
        deliveries = _wait_delivered(kube, install.tenant, "grow", ids, timeout_s=180)
        assert _lateness_ms(deliveries, ids)[0] >= 0
    finally:
        kube.kubectl("delete", "dt", "grow", "-n", install.tenant, "--wait=false")
        kube.wait(lambda: not _pods(kube, install.tenant, "delayq.io/topic=grow"),
                  timeout_s=180, what="the grown topic's pods gone")


#: `ls` of argv 1 with the operator's admin login, run in an operator pod: the parents of the
#: topics' trees are listable by the operator alone (coordination/acl.py `parent_acl`).
ZOOKEEPER_LS = """
import json, os, sys
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
login = "delayq-operator:" + os.environ["DELAYQ_ZOOKEEPER_ADMIN_PASSWORD"]
client = KazooClient(hosts=os.environ["DELAYQ_ZOOKEEPER"], auth_data=[("digest", login)])
client.start(timeout=30)
try:
    print(json.dumps(client.get_children(sys.argv[1])))
except NoNodeError:
    print("[]")
client.stop()
"""


def _zookeeper_children(kube: Kube, install: Install, path: str) -> list[str]:
    """The children of ZooKeeper's `path`, as the operator (the leader's pod) sees them."""
    out = _in_pod(kube, install.namespace, _leader_pod(kube, install), ZOOKEEPER_LS, path)
    children: list[str] = json.loads(out.strip().splitlines()[-1])
    return children


def test_deleting_the_topic_and_uninstalling_leave_nothing_behind(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 8: the topic's pods and its ZooKeeper tree go with it (its volumes stay:
    deletionPolicy Retain, the default), and so does the operator's copy of its credentials
    in the release's namespace; `helm uninstall` removes the operator and ZooKeeper."""
    assert webhook_topic in _zookeeper_children(kube, install, f"/delayq/{install.tenant}")
    copy = (f"app.kubernetes.io/component=topic-credentials,delayq.io/topic={webhook_topic},"
            f"delayq.io/topic-namespace={install.tenant}")
    assert len(kube.items("secret", install.namespace, copy)) == 1
    claims = kube.items("pvc", install.tenant, f"delayq.io/topic={webhook_topic}")
    kube.kubectl("delete", "dt", webhook_topic, "-n", install.tenant, "--wait=true",
                 timeout=180)
    kube.wait(lambda: not _pods(kube, install.tenant, f"delayq.io/topic={webhook_topic}"),
              timeout_s=180, what="the topic's pods gone")
    kube.wait(lambda: webhook_topic not in _zookeeper_children(
        kube, install, f"/delayq/{install.tenant}"), timeout_s=120,
        what="the topic's ZooKeeper tree gone")
    kube.wait(lambda: not kube.items("secret", install.namespace, copy), timeout_s=120,
              what="the operator's copy of the topic's credentials collected")
    kept = kube.items("pvc", install.tenant, f"delayq.io/topic={webhook_topic}")
    assert {c["metadata"]["name"] for c in kept} == {c["metadata"]["name"] for c in claims}
    kube.helm("uninstall", RELEASE, "--namespace", install.namespace, "--wait",
              "--timeout", "3m", timeout=240)
    kube.wait(lambda: not kube.items("pods", install.namespace), timeout_s=180,
              what="the release's pods gone")
