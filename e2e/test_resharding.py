"""Growing brokers on a real API server (issue 16): `spec.brokers` 1 -> 2 with messages
pending, the operator process moving slots 8-15 to the new broker, killed with SIGKILL inside a
move's step and finished by a new operator process.

Each broker pod's Redis is a local redis-server (pods do not run under KWOK): the operator runs
e2e/operator_main.py with the Redis address map (`LocalOperator.addresses_file`), and reaches
ZooKeeper through a `ZkHold` proxy (tests/fleet/zk_hold.py), which can hold it after it recorded
a step. The pending messages wait with no delay service running, so they are all in Redis while
their slots move; `delayq serve` then runs on both brokers and delivers them all, none early,
each once.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient
from tests.fleet.zk_hold import ZkHold

from delayq.coordination.acl import ADMIN_USER, ZkIdentity
from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, Step
from delayq.coordination.routing import Routing
from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.dataplane import (
    admin,
    like_a_broker_pod,
    schedule,
    schedule_status,
    service_url,
    start_serve,
)
from e2e.harness.kube import Kube, Release
from e2e.harness.operator import LocalOperator, chart_env, tenant_namespace
from e2e.harness.process import INTERVAL_S, NOT_YET, REPO, ManagedProcess
from e2e.harness.receiver import Received
from e2e.harness.topics import (
    all_pods_running,
    delay_topic,
    described_with,
    topic_credentials,
    topic_secret,
    wait_reconciled,
)

TOPIC = "grow"
PENDING = 48  # every slot holds some (crc32 of the ids)
PAUSE_MS = 120_000  # a paused Redis resumes by itself after this, should the test die


def pause_writes(client: redis.Redis) -> None:
    client.client_pause(PAUSE_MS, all=False)


@dataclass
class Growing:
    """One topic in its own namespace, the operator (a local process, reaching ZooKeeper
    through `hold`) and two local redis-servers playing its brokers' pods."""

    kube: Kube
    ns: str
    workdir: Path
    op: LocalOperator
    hold: ZkHold
    zk: KazooClient  # the test's own view of ZooKeeper, as the operator's admin user
    received: Received
    webhook_url: str
    brokers: list[RedisServer] = field(default_factory=lambda: [RedisServer(), RedisServer()])
    serve: ManagedProcess | None = None
    table: dict[str, list[Any]] = field(default_factory=dict)
    #: The step after whose record the operator's ZooKeeper requests stop passing (None: none).
    hold_step: Step | None = None

    @property
    def addresses(self) -> Path:
        return self.workdir / "addresses.json"

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(self.ns, TOPIC)

    def holds_after(self, path: str, data: bytes) -> bool:
        return (self.hold_step is not None and path.startswith(f"{self.paths.migrations}/")
                and Migration.decode(data).step is self.hold_step)

    def admin(self, broker: int) -> redis.Redis:
        password = topic_secret(self.kube, self.ns, TOPIC, "redis-admin-password")
        return admin(self.brokers[broker].port, password)

    def play(self, broker: int, first: Callable[[redis.Redis], object] | None = None) -> None:
        """Broker `broker`'s pod (and master Service) is played by brokers[broker]; `first` is
        done on its Redis (as its admin) before the operator can reach it."""
        name = f"{TOPIC}-redis-{broker}-0"

        def its_ip() -> str | None:
            pods = all_pods_running(self.kube, self.ns, TOPIC) or []
            return next((p["status"]["podIP"] for p in pods if p["metadata"]["name"] == name),
                        None)

        # the broker's StatefulSet may not have made its pod yet when the others run
        ip = self.kube.wait(its_ip, timeout_s=120, what=f"{name} Running")
        self.brokers[broker].start()
        like_a_broker_pod(self.kube, self.ns, TOPIC, self.brokers[broker].port)
        if first is not None:
            with self.admin(broker) as client:
                first(client)
        local = ["127.0.0.1", self.brokers[broker].port]
        self.table.update({ip: local, f"{TOPIC}-redis-{broker}.{self.ns}.svc": local})
        self.addresses.write_text(json.dumps(self.table))

    def pause(self, broker: int) -> None:
        with self.admin(broker) as client:
            pause_writes(client)

    def unpause(self) -> None:
        for broker in range(len(self.brokers)):
            with self.admin(broker) as client:
                client.client_unpause()

    def status(self) -> dict[str, Any]:
        return (self.kube.get("dt", TOPIC, self.ns) or {}).get("status", {})

    def resharding(self, reason: str) -> dict[str, Any] | None:
        found = [c for c in self.status().get("conditions", []) if c["type"] == "Resharding"]
        return self.status() if found and found[0]["reason"] == reason else None

    def moving(self) -> dict[int, Step]:
        """slot -> the step `migrations/<slot>` records, read from ZooKeeper right now."""
        if not self.zk.exists(self.paths.migrations):
            return {}
        slots = [int(child) for child in self.zk.get_children(self.paths.migrations)]
        return {slot: Migration.decode(self.zk.get(self.paths.migration(slot))[0]).step
                for slot in slots}

    def routing(self) -> Routing:
        return Routing.from_json(self.zk.get(self.paths.routing)[0])

    def pending_on_one_broker(self) -> list[str]:
        """The topic on one broker, PENDING messages scheduled through `delayq serve` (then
        stopped), and `spec.brokers` patched to 2: what the operator grows from."""
        self.kube.apply(delay_topic(TOPIC, slotAmount=16, brokers=1, replicasPerBroker=0,
                                    topicType="webhook", resharding={"maxConcurrentMoves": 1},
                                    delivery={"webhook": {"url": self.webhook_url,
                                                          "allowPrivateTargets": True,
                                                          "allowInsecureHttp": True}}), self.ns)
        wait_reconciled(self.kube, self.op, self.ns, TOPIC)
        self.play(0)
        self.kube.wait(lambda: self.status() if [b.get("state") for b in self.status().get(
            "brokers", [])] == ["Ready"] else None, timeout_s=90, what="broker 0 serving")
        password, token = topic_credentials(self.kube, self.ns, TOPIC)
        self.serve, base = start_serve(self.kube, self.ns, TOPIC, self.workdir,
                                       service_url(password, self.brokers[0].port))
        pending = [f"pending-{i}" for i in range(PENDING)]
        for message_id in pending:
            schedule(base, TOPIC, token, message_id, delay_ms=3000)
        self.serve.stop()
        self.serve = None
        self.kube.kubectl("patch", "dt", TOPIC, "-n", self.ns, "--type", "merge",
                          "-p", '{"spec":{"brokers":2}}')
        return pending

    def completed(self, pending: list[str], reasons: tuple[str, ...]) -> None:
        """Resharding completed (by a new operator process): 8/8 slots, the Events, every
        message on the broker its slot is routed to now; then `delayq serve` on both brokers
        delivers the pending ones and 16 more, none early, each once."""
        grown = self.kube.wait(lambda: self.resharding("Completed"), timeout_s=120,
                               what="Resharding completed by the new operator")
        assert [b["slots"] for b in grown["brokers"]] == [8, 8]
        assert grown["resharding"] == {"moved": 8, "total": 8}
        described = wait_until(
            lambda: described_with(self.kube, self.ns, TOPIC, reasons), timeout_s=30,
            what="the resharding Events in kubectl describe", interval_s=INTERVAL_S,
            not_yet=NOT_YET)
        assert "Moved 8 slots" in described
        assert self.moving() == {}
        self.kube.wait(lambda: sum(self.status()["depths"].values()) == len(pending),
                       timeout_s=30, what=f"{len(pending)} messages in the depths of both brokers")
        with self.admin(1) as client:
            assert client.dbsize() > 0  # the moved slots' keys are on the new broker
        password, token = topic_credentials(self.kube, self.ns, TOPIC)
        self.serve, base = start_serve(self.kube, self.ns, TOPIC, self.workdir,
                                       *(service_url(password, b.port) for b in self.brokers))
        after = [f"after-{i}" for i in range(16)]
        for message_id in after:
            schedule(base, TOPIC, token, message_id, delay_ms=500)
        expected = set(pending + after)
        wait_until(lambda: expected <= {m.get("id") for _, m in self.received}, timeout_s=60,
                   what="every message delivered", abort=self.serve.exited,
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
        early = [m["id"] for at_ms, m in self.received if at_ms < m["dueMs"]]
        assert not early, f"delivered before they were due: {early}"
        ids = [m.get("id") for _, m in self.received]
        assert len(ids) == len(set(ids)) == len(pending + after)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """On a failure, print what explains it: the operator's and the service's log tails."""
        try:
            yield
        except Exception:
            print(f"--- grow operator log tail:\n{self.op.tail()}")
            print(f"--- topic: {self.kube.get('dt', TOPIC, self.ns)}")
            if self.serve is not None:
                print(f"--- delayq serve log tail:\n{self.serve.tail(60)}")
            raise

    def close(self) -> None:
        if self.serve is not None:
            self.serve.stop()
        self.kube.kubectl("delete", "dt", TOPIC, "-n", self.ns, "--wait=false", check=False)
        try:
            self.kube.wait(lambda: self.kube.get("dt", TOPIC, self.ns) is None, timeout_s=60,
                           what="the grown topic to be deleted")
        finally:
            self.op.stop()
            self.hold.close()
            self.zk.stop()
            self.zk.close()
            for server in self.brokers:
                server.stop()
            self.kube.kubectl("delete", "namespace", self.ns, "--wait=false")


@pytest.fixture
def growing(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory, webhook_receiver: tuple[str, Received],
) -> Iterator[Growing]:
    url, received = webhook_receiver
    ns = f"e2e-grow-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("grow")
    env = chart_env(kube, chart_release, zookeeper)
    zk = KazooClient(hosts=zookeeper.hosts, auth_data=[
        ZkIdentity(ADMIN_USER, env["DELAYQ_ZOOKEEPER_ADMIN_PASSWORD"]).auth_data])
    zk.start(timeout=30)
    # `grown` is bound below, before the operator (the proxy's only client) starts
    hold = ZkHold(("127.0.0.1", zookeeper.port),
                  lambda path, data: grown.holds_after(path, data))
    op = LocalOperator(
        repo=REPO, kubeconfig=operator_kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log", addresses_file=workdir / "addresses.json",
        env_overrides={**env, "DELAYQ_ZOOKEEPER": hold.hosts, "DELAYQ_HEALTH_INTERVAL_S": "1"},
    )
    grown = Growing(kube, ns, workdir, op, hold, zk, received, url)
    grown.table["*"] = ["127.0.0.1", free_port()]  # unmapped hosts fail at once
    grown.addresses.write_text(json.dumps(grown.table))
    try:
        op.start()
        yield grown
    finally:
        grown.close()


def test_brokers_grow_1_to_2_and_half_the_slots_move_with_their_messages(
    growing: Growing,
) -> None:
    """The operator moves slots 8-15 to the new broker once its master is ready, reports it in
    status and Events, and every message, pending before or scheduled after, is delivered,
    none early.

    The new broker's Redis first refuses writes (min-replicas-to-write without a replica), so
    the first move fails in its copy, left recorded with its slot frozen (`MoveFailed`); the
    operator is then killed with SIGKILL, the broker takes writes again, and a new operator
    process finishes the recorded move and the rest."""
    with growing.explained():
        pending = growing.pending_on_one_broker()
        growing.play(1, lambda client: client.config_set("min-replicas-to-write", 1))
        growing.kube.wait(lambda: growing.resharding("MoveFailed"), timeout_s=120,
                          what="a failed move")
        growing.op.kill()  # kill -9 mid-resharding: a move recorded in its copy, its slot frozen
        with growing.admin(1) as client:
            client.config_set("min-replicas-to-write", 0)
        growing.op.start()  # a new operator process: it has only ZooKeeper, Redis and the status
        growing.completed(pending, ("ReshardingStarted", "ReshardingFailed", "SlotsMoved",
                                    "ReshardingCompleted"))


@pytest.mark.parametrize("step", [Step.FREEZE, Step.SWITCH, Step.CLEAN],
                         ids=[f"killed-in-{s}" for s in (Step.FREEZE, Step.SWITCH, Step.CLEAN)])
def test_the_operator_killed_9_inside_a_step_leaves_a_move_a_new_one_finishes(
    growing: Growing, step: Step,
) -> None:
    """The operator process is held inside `step` of its first move and killed with SIGKILL
    there, with no hook in the product: in freeze the source's Redis pauses writes (the freeze
    script waits), in switch its ZooKeeper proxy passes nothing after the record of `switch`,
    in clean the target pauses until the copy is recorded, then the source (the mover copies,
    switches, records clean and waits on its UNLINK). ZooKeeper still shows that step after the
    kill, its lock goes with the dead process's session, and a new operator process completes
    the move and the rest (the copy step: the test above)."""
    with growing.explained():
        pending = growing.pending_on_one_broker()
        if step is Step.FREEZE:
            growing.pause(0)
        growing.hold_step = step if step is Step.SWITCH else None
        growing.play(1, pause_writes if step is Step.CLEAN else None)
        if step is Step.CLEAN:
            growing.kube.wait(lambda: Step.COPY in growing.moving().values(), timeout_s=60,
                              what="a move in its copy")
            growing.pause(0)
            with growing.admin(1) as client:
                client.client_unpause()
        [(slot, shown)] = growing.kube.wait(
            lambda: [(s, t) for s, t in growing.moving().items() if t is step], timeout_s=60,
            what=f"a move in its {step}")
        growing.op.kill()
        assert growing.moving() == {slot: shown}  # killed in it: the next step never recorded
        assert growing.routing().broker_of_slot[slot] == (1 if step is Step.CLEAN else 0)
        growing.unpause()
        growing.hold.release()
        growing.op.start()  # a new operator process: it has only ZooKeeper, Redis and the status
        growing.completed(pending, ("ReshardingStarted", "SlotsMoved", "ReshardingCompleted"))


def test_slot_amount_grows_16_to_32_while_messages_are_delivered(growing: Growing) -> None:
    """`spec.slotAmount` 16 -> 32 with messages pending and arriving: the operator doubles the
    slots (routing 32 slots at key generation 1, status appliedSlotAmount 32, the Resharding
    condition, a SlotsSplit Event in describe) while `delayq serve` runs on through it; every
    message, pending before or scheduled during and after, is delivered, none early."""

    def doubled() -> dict[str, Any] | None:
        done = growing.resharding("Completed")
        return done if done is not None and done.get("appliedSlotAmount") == 32 else None

    with growing.explained():
        growing.kube.apply(delay_topic(TOPIC, slotAmount=16, brokers=1, replicasPerBroker=0,
                                       topicType="webhook", ackTimeout="5s",
                                       delivery={"webhook": {"url": growing.webhook_url,
                                                             "timeout": "2s",
                                                             "allowPrivateTargets": True,
                                                             "allowInsecureHttp": True}}),
                           growing.ns)
        wait_reconciled(growing.kube, growing.op, growing.ns, TOPIC)
        growing.play(0)
        growing.kube.wait(lambda: growing.status() if [b.get("state") for b in growing.status(
        ).get("brokers", [])] == ["Ready"] else None, timeout_s=90, what="broker 0 serving")
        password, token = topic_credentials(growing.kube, growing.ns, TOPIC)
        growing.serve, base = start_serve(growing.kube, growing.ns, TOPIC, growing.workdir,
                                          service_url(password, growing.brokers[0].port))
        pending = [f"pending-{i}" for i in range(2 * PENDING)]
        for message_id in pending:
            schedule(base, TOPIC, token, message_id, delay_ms=4000)

        growing.kube.kubectl("patch", "dt", TOPIC, "-n", growing.ns, "--type", "merge",
                             "-p", '{"spec":{"slotAmount":32}}')
        during: list[str] = []
        refused: list[str] = []
        unexpected: list[str] = []

        def scheduled_one_more() -> dict[str, Any] | None:
            """A steady trickle of writes through the doubling; done once the doubling is. A
            write may be refused for a moment, and only so: 503 (the slots froze past the API's
            wait, or the old service answers while the new one takes over) or a refused
            connection (the in-process restart); the next id is tried then."""
            message_id = f"during-{len(during) + len(refused)}"
            try:
                status = schedule_status(base, TOPIC, token, message_id, delay_ms=1000)
            except urllib.error.URLError as error:
                refused_connection = isinstance(error.reason, ConnectionRefusedError)
                status = 503 if refused_connection else 0
                if not refused_connection:
                    unexpected.append(f"{message_id}: {error!r}")
            if 200 <= status < 300:
                during.append(message_id)
            else:
                refused.append(message_id)
                if status != 503:
                    unexpected.append(f"{message_id}: HTTP {status}")
            return doubled()

        grown = wait_until(scheduled_one_more, timeout_s=120, what="the slots doubled",
                           abort=growing.serve.exited, interval_s=INTERVAL_S, not_yet=NOT_YET)
        print(f"e2e: {len(during)} writes stored during the doubling, {len(refused)} refused "
              f"for a moment: {refused}")
        assert not unexpected, unexpected
        assert [b["slots"] for b in grown["brokers"]] == [32]
        routing = growing.routing()
        assert (routing.slot_amount, routing.generation) == (32, 1)
        described = wait_until(
            lambda: described_with(growing.kube, growing.ns, TOPIC, ("SlotsSplit",)),
            timeout_s=30, what="the SlotsSplit Event in kubectl describe",
            interval_s=INTERVAL_S, not_yet=NOT_YET)
        assert "Doubled the slots 16 -> 32" in described

        after = [f"after-{i}" for i in range(32)]
        for message_id in after:
            schedule(base, TOPIC, token, message_id, delay_ms=500)
        expected = set(pending + during + after)
        wait_until(lambda: expected <= {m.get("id") for _, m in growing.received},
                   timeout_s=60, what="every message delivered", abort=growing.serve.exited,
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
        early = [m["id"] for at_ms, m in growing.received if at_ms < m["dueMs"]]
        assert not early, f"delivered before they were due: {early}"
        # at least once: a delivery in flight when the freeze fenced its owner is sent again
        # after its lease (ackTimeout 5 s), from its new slot
        assert {m.get("id") for _, m in growing.received} == expected
