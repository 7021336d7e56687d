"""Pods as a real cluster's controllers would create them, each played by a real redis-server.

kmock runs no controllers and there is no pod network, so `RedisPods` does what the kubelet and
the cluster DNS would: it stores the pod in kmock with a pod IP, starts "its" Redis the way the
chart's start script does (the recorded master as master, every other pod as a replica of the
broker's master Service, with the Secret's password), and maps pod IPs and master Service names
(through the EndpointSlice the operator writes, as kube-proxy would) to the local servers for
the operator's `RedisCommands(addresses=...)` (a test-only setting).
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kmock
import redis

from delayq.kube import naming
from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import acl
from delayq.queue.client import Queue
from delayq.queue.topic import Topic, slot_of

NAMESPACE = "shop"
OPERATOR_NAMESPACE = "delayq-system"  # the operator's own (its copies of the credentials)
LOOPBACK = "127.0.0.1"
SLICES = "discovery.k8s.io/v1/endpointslices"
UIDS = itertools.count()  # pod uids: a pod made again gets a new one
SYNC_TIMEOUT_S = 10.0


@dataclass
class RedisPod:
    name: str
    broker: int
    ip: str
    server: RedisServer
    reachable: bool = True


class RedisPods(Mapping[str, tuple[str, int]]):
    """The Redis pods of topic `orders`; as a Mapping: pod IP / Service host -> local address.

    A pod's servers come from a pool of real redis-servers shared by the test module; `reset()`
    restarts the ones a test used (Redis has no command that forgets a replication offset, and
    a fresh process is what a fresh pod is), so every test starts from pristine servers.
    """

    def __init__(self, api: kmock.KubernetesEmulator, pool: Sequence[RedisServer]) -> None:
        self.api = api
        self.pool = list(pool)
        self.pods: dict[str, RedisPod] = {}
        self.closed_port = free_port()  # nothing listens here: an unreachable address

    # --- the address map RedisCommands reads on every call ----------------------------------

    def __getitem__(self, host: str) -> tuple[str, int]:
        for pod in self.pods.values():
            if pod.ip == host:
                return (LOOPBACK, pod.server.port if pod.reachable else self.closed_port)
        for broker in {pod.broker for pod in self.pods.values()}:
            if host == master_service_host(broker):
                master = self.served_master(broker)  # the Service's EndpointSlice
                return self[master.ip] if master else (LOOPBACK, self.closed_port)
        raise KeyError(host)

    def __iter__(self) -> Iterator[str]:
        yield from (pod.ip for pod in self.pods.values())
        yield from sorted({master_service_host(pod.broker) for pod in self.pods.values()})

    def __len__(self) -> int:
        return len(list(iter(self)))

    # --- pods -------------------------------------------------------------------------------

    def add(self, broker: int, count: int, master: int | None = None) -> list[RedisPod]:
        """Pods 0..count-1 of a broker, Ready, started as the chart's start script would.

        The users of the start script (delayq.queue.acl: the operator's admin user, the
        services' restricted user, `default` off) are set once the server runs (RedisServer's
        readiness ping does not authenticate). `master` is recorded as the operator would have
        (its ConfigMap and EndpointSlice). A replica's REPLICAOF target is the master Service
        as resolved now; unlike kube-proxy it does not follow later slice changes (the
        operator's demotions resolve the Service again when they run).
        """
        password, admin_password = self.password(), self.admin_password()
        added = []
        for ordinal in range(count):
            name = naming.redis_pod("orders", broker, ordinal)
            ip = f"10.0.{broker}.{ordinal}"
            self._store_pod(name, broker, ip, {})
            if len(self.pods) >= len(self.pool):
                raise AssertionError(f"only {len(self.pool)} redis-servers in the pool")
            server = self.pool[len(self.pods)]
            pod = self.pods[name] = RedisPod(name, broker, ip, server)
            self._start_script(server, password, admin_password)
            added.append(pod)
        if master is not None:
            self.record_master(broker, added[master])
        for ordinal, pod in enumerate(added):
            with self.client(pod.name) as client:
                if ordinal == master:
                    client.replicaof("NO", "ONE")
                else:  # a replica of the master Service: of nothing while no pod is labelled
                    client.replicaof(*self[master_service_host(broker)])
        return added

    def _store_pod(self, name: str, broker: int, ip: str, labels: Mapping[str, str]) -> None:
        """The pod object, Ready, with a new uid (and `labels` besides the broker's)."""
        self.api.objects["v1/pods", NAMESPACE, name] = {
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": f"{name}-{next(UIDS)}",
                "labels": {
                    naming.LABEL_TOPIC: "orders",
                    naming.LABEL_COMPONENT: naming.COMPONENT_REDIS,
                    naming.LABEL_BROKER: str(broker),
                    **labels,
                },
            },
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        }

    def make_again(self, name: str, labels: Mapping[str, str]) -> None:
        """The StatefulSet controller makes a deleted pod again (same name and IP, a new uid,
        `labels`: its revision); "its" Redis is left to the test to restart."""
        pod = self.pods[name]
        self._store_pod(name, pod.broker, pod.ip, labels)

    @staticmethod
    def _start_script(server: RedisServer, password: str, admin_password: str) -> None:
        """The users and replication login the chart's start script gives a pod's Redis."""
        admin = redis.Redis(port=server.port)
        topic = Topic("orders", namespace=NAMESPACE, slot_amount=1)
        admin.execute_command(
            "ACL", "SETUSER", acl.SERVICE_USER, *acl.service_user_rules(topic), f">{password}"
        )
        admin.config_set("masteruser", acl.ADMIN_USER)
        admin.config_set("masterauth", admin_password)
        admin.execute_command(
            "ACL", "SETUSER", acl.ADMIN_USER, *acl.ADMIN_RULES, f">{admin_password}"
        )
        admin.execute_command("ACL", "SETUSER", "default", "off")
        admin.close()

    def restart_replica(self, name: str, masterauth: str) -> None:
        """The pod's Redis restarts empty as a replica of its master Service that logs in
        with `masterauth` (another password than the master's: a credentials change that
        reached this pod only)."""
        pod = self.pods[name]
        pod.server.stop()
        pod.server.start()
        self._start_script(pod.server, self.password(), self.admin_password())
        with self.client(name) as client:
            client.config_set("masterauth", masterauth)
            client.replicaof(*self[master_service_host(pod.broker)])

    def password(self) -> str:
        """The Redis password from the Secret the operator generated (what the pods mount)."""
        secret = self.api.objects["v1/secrets", NAMESPACE, naming.credentials_secret("orders")]
        return base64.b64decode(secret.raw["data"][naming.SECRET_REDIS_PASSWORD]).decode()

    def admin_password(self) -> str:
        """The operator's Redis password, from the same Secret."""
        secret = self.api.objects["v1/secrets", NAMESPACE, naming.credentials_secret("orders")]
        return base64.b64decode(secret.raw["data"][naming.SECRET_REDIS_ADMIN_PASSWORD]).decode()

    def record_master(self, broker: int, pod: RedisPod) -> None:
        """What an earlier pass of the operator left: `pod` recorded as the broker's master and
        the master Service's EndpointSlice at its IP."""
        record = naming.redis_masters_config_map("orders")
        uid = self.api.objects["v1/pods", NAMESPACE, pod.name].raw["metadata"]["uid"]
        data = {naming.master_key(broker): naming.master_record(pod.name, uid)}
        try:
            self.api.objects["v1/configmaps", NAMESPACE, record].patch({"data": data})
        except KeyError:
            self.api.objects["v1/configmaps", NAMESPACE, record] = {
                "metadata": {"name": record, "namespace": NAMESPACE},
                "data": data,
            }
        service = naming.redis_master_service("orders", broker)
        self.api.objects[SLICES, NAMESPACE, service] = {
            "metadata": {"name": service, "namespace": NAMESPACE},
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [pod.ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": pod.name},
                }
            ],
            "ports": [{"name": "redis", "port": naming.REDIS_PORT, "protocol": "TCP"}],
        }

    def recorded_master(self, broker: int) -> str | None:
        """The pod name of the broker's master in the operator's record (the ConfigMap the pods
        read; the record also names the pod's uid)."""
        try:
            record = self.api.objects[
                "v1/configmaps", NAMESPACE, naming.redis_masters_config_map("orders")
            ]
        except KeyError:
            return None
        value: str | None = (record.raw.get("data") or {}).get(naming.master_key(broker))
        return value.split("/")[0] if value else None

    def served_master(self, broker: int) -> RedisPod | None:
        """The pod the master Service reaches: its EndpointSlice's ready address."""
        try:
            service = naming.redis_master_service("orders", broker)
            found = self.api.objects[SLICES, NAMESPACE, service]
        except KeyError:
            return None
        for endpoint in found.raw.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for pod in self.pods.values():
                if pod.ip in endpoint["addresses"]:
                    return pod
        return None

    def client(self, name: str) -> redis.Redis:
        """A test's own connection to a pod's Redis (bypasses `reachable`)."""
        return redis.Redis(
            port=self.pods[name].server.port,
            username=acl.ADMIN_USER,
            password=self.admin_password(),
        )

    def replication(self, name: str) -> dict[str, Any]:
        """INFO replication of a pod's Redis, as it really is."""
        with self.client(name) as client:
            return dict(client.info("replication"))

    def offset(self, name: str) -> int:
        info = self.replication(name)
        key = "master_repl_offset" if info["role"] == "master" else "slave_repl_offset"
        return int(info.get(key, 0))

    def replicates_from(self, name: str, master: str) -> bool:
        info = self.replication(name)
        return info["role"] == "slave" and int(info["master_port"]) == (
            self.pods[master].server.port
        )

    def wait_for_offset(self, name: str, offset: int) -> None:
        wait_until(
            lambda: self.offset(name) >= offset,
            SYNC_TIMEOUT_S,
            f"{name} to replicate up to offset {offset}",
            interval_s=0.02,
        )

    def partition(self, name: str) -> None:
        """The operator can no longer reach this pod's Redis; the server keeps running."""
        self.pods[name].reachable = False

    def heal(self, name: str) -> None:
        self.pods[name].reachable = True

    def recreate(self, name: str, ip: str) -> None:
        """The pod made again by its StatefulSet (a deletion, a drain): same name, a new uid
        and IP, Ready; "its" Redis keeps running with its data (the volume came along)."""
        self.pods[name].ip = ip
        self.api.objects["v1/pods", NAMESPACE, name].patch(
            {"metadata": {"uid": f"{name}-{next(UIDS)}"}, "status": {"podIP": ip}}
        )

    def cut_from_master(self, name: str) -> None:
        """The replica's link to its master breaks: it stays a replica, its offset freezes."""
        with self.client(name) as client:
            client.replicaof(LOOPBACK, self.closed_port)

    def reset(self) -> None:
        """Restart the servers this test used: fresh pods for the next test."""
        for pod in self.pods.values():
            pod.server.stop()
            pod.server.start()
        self.pods.clear()

    # --- data -------------------------------------------------------------------------------

    def queue(self, name: str, slot_amount: int) -> Queue:
        topic = Topic("orders", namespace=NAMESPACE, slot_amount=slot_amount)
        return Queue(self.client(name), topic)


def master_service_host(broker: int) -> str:
    return f"{naming.redis_master_service('orders', broker)}.{NAMESPACE}.svc"


def basis_for(slot: int, slot_amount: int) -> str:
    """A slot basis that routes to `slot`."""
    return next(f"k{i}" for i in range(10_000) if slot_of(f"k{i}", slot_amount) == slot)


def fill(
    queue: Queue, slots: Sequence[int], scheduled: int, prepared: int, prefix: str = "m"
) -> None:
    """Real messages on a master: `scheduled` still delayed, `prepared` claimed by a worker."""
    slot_amount = queue.topic.slot_amount
    for index in range(scheduled):
        basis = basis_for(slots[index % len(slots)], slot_amount)
        queue.schedule(f"{prefix}-later-{index}", b"x", delay_ms=3_600_000, slot_basis=basis)
    for index in range(prepared):
        slot = slots[index % len(slots)]
        basis = basis_for(slot, slot_amount)
        queue.schedule(f"{prefix}-due-{index}", b"x", delay_ms=0, slot_basis=basis)
        epoch = queue.take_over(slot)
        assert len(queue.claim(slot, epoch, max_count=1).messages) == 1


def terminate(api: kmock.KubernetesEmulator, name: str) -> None:
    """What a rollout, a drain or `kubectl delete pod` does first: the pod gets a
    deletionTimestamp and keeps running (its preStop hook holds a master until switched).

    A real API server keeps a deleted pod until its kubelet has stopped it (graceful deletion);
    kmock removes an object with a deletionTimestamp at its next request unless a finalizer
    holds it, so one plays the kubelet here."""
    api.objects["v1/pods", NAMESPACE, name].patch(
        {
            "metadata": {
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["tests.delayq.io/kubelet"],
            }
        }
    )


@dataclass
class ServiceWriter:
    """Schedules messages one after another through an address that follows the master, as
    a delay service does through the master Service, on its own thread.

    `resolve` names the address now (RedisPods' Service mapping, or a bench's). A failed
    call (paused connection closed, READONLY, refused) is retried with the same message id
    on a fresh connection to the address resolved again; only acknowledged ids are recorded,
    with the time of their acknowledgement.
    """

    resolve: Callable[[], tuple[str, int]]
    password: str
    topic: Topic
    interval_s: float = 0.001  # paced, so that the operator's thread gets the interpreter
    acked: list[tuple[str, float]] = field(default_factory=list)
    failures: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="service-writer", daemon=True)

    def __enter__(self) -> ServiceWriter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=SYNC_TIMEOUT_S)

    def wait_for(self, count: int, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Until `count` more messages are acknowledged."""
        target = len(self.acked) + count
        wait_until(lambda: len(self.acked) >= target, timeout_s, f"{count} more writes")

    def max_gap_s(self) -> float:
        """The longest time between two consecutive acknowledgements: the writes' pause."""
        times = [at for _, at in self.acked]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def _run(self) -> None:
        queue: Queue | None = None
        address: tuple[str, int] | None = None
        index = 0
        while not self._stop.is_set():
            try:
                if queue is None or address != self.resolve():
                    if queue is not None:
                        queue.close()
                    address = self.resolve()
                    client = redis.Redis(
                        *address,
                        username=acl.ADMIN_USER,
                        password=self.password,
                        socket_timeout=SYNC_TIMEOUT_S,
                    )
                    queue = Queue(client, self.topic)
                queue.schedule(f"w-{index}", b"x", delay_ms=3_600_000)
            except (redis.RedisError, OSError):
                self.failures += 1
                if queue is not None:
                    queue.close()
                queue = None
                time.sleep(self.interval_s)
                continue
            self.acked.append((f"w-{index}", time.monotonic()))
            index += 1
            time.sleep(self.interval_s)
        if queue is not None:
            queue.close()


def set_pod_ready(api: kmock.KubernetesEmulator, name: str, ready: bool) -> None:
    status = "True" if ready else "False"
    api.objects["v1/pods", NAMESPACE, name].patch(
        {"status": {"conditions": [{"type": "Ready", "status": status}]}}
    )


def store_service_pod(api: kmock.KubernetesEmulator, ordinal: int, **fields: Any) -> None:
    """The pod object of orders' service pod `ordinal`, with `fields` (`status`, `spec`)."""
    name = f"orders-service-{ordinal}"
    api.objects["v1/pods", NAMESPACE, name] = {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": naming.service_selector("orders"),
        },
        **fields,
    }


def add_service_pods(api: kmock.KubernetesEmulator, count: int) -> None:
    for ordinal in range(count):
        store_service_pod(
            api, ordinal, status={"conditions": [{"type": "Ready", "status": "True"}]}
        )
    services_rolled_to(api, count)


def services_rolled_to(
    api: kmock.KubernetesEmulator, ready: int, updated: int | None = None
) -> None:
    """The service StatefulSet's status as its controller writes it: `ready` pods, `updated`
    of them (default all) on its current spec; no controller runs under kmock."""
    try:
        statefulset = api.objects["apps/v1/statefulsets", NAMESPACE, "orders-service"]
    except KeyError:
        return  # not provisioned yet
    updated = ready if updated is None else updated
    generation = statefulset.get("metadata", {}).get("generation")
    status: dict[str, object] = {
        "replicas": ready,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "currentRevision": "orders-service-new" if updated == ready else "orders-service-old",
        "updateRevision": "orders-service-new",
    }
    if generation is not None:
        status["observedGeneration"] = generation
    statefulset.patch({"status": status})
