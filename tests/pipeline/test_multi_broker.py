"""The pipeline and the routed client on a two-broker topic, against real redis-servers, the
session's ZooKeeper and two `delayq serve` processes: every message ingested (or scheduled with
`RoutedQueue`) lands on its slot's broker and is delivered by the slot's owner, archive reads the
journal of both brokers and the audit finds nothing lost or early; and a multi-broker topic
without a routing is refused in one line before anything is written."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import redis
import redis.asyncio
from kazoo.client import KazooClient

from delayq.cli import main
from delayq.coordination.layout import TopicPaths
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import initial_routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic, functions
from delayq.queue.acl import service_user_rules
from delayq.queue.keys import Part, slot_keys
from tests.fleet.conftest import NAMESPACE, SLOTS, ProcessFleet

pytestmark = pytest.mark.slow
ROUTING = initial_routing(SLOTS, 2)  # slots 0-7 on broker 0, 8-15 on broker 1
JOURNAL_MAX_LEN = 10_000
INGESTED, SCHEDULED = 300, 100
DELAY_MS = 500


@pytest.fixture
async def fleet(
    redis_server: RedisServer, second_broker: RedisServer, zookeeper_server: ZooKeeperServer
) -> AsyncIterator[ProcessFleet]:
    """Two serve processes, one preferring each broker, on a topic routed over both."""
    topic = Topic(f"p-{uuid.uuid4().hex[:10]}", namespace=NAMESPACE, slot_amount=SLOTS)
    urls = [redis_server.url, second_broker.url]
    with tempfile.TemporaryDirectory(prefix="delayq-pipeline-fleet-") as log_dir:
        fleet = ProcessFleet(redis_server.url, zookeeper_server, topic, Path(log_dir))
        fleet.broker_urls = ",".join(urls)
        routing = TopicPaths(NAMESPACE, topic.name).routing
        fleet.observer().create(routing, ROUTING.to_json(), makepath=True)
        try:
            for broker in (0, 1):
                member = f"member-{broker}"
                config = dataclasses.replace(
                    fleet.config(member),
                    journal_max_len=JOURNAL_MAX_LEN,
                    preferred_broker=str(broker),
                )
                process = ServeProcess(config, fleet.log_dir / f"{member}.log")
                fleet.processes[member] = process.start()
            yield fleet
        finally:
            fleet.close()


def topic_args(fleet: ProcessFleet, zookeeper: bool = True) -> list[str]:
    urls = fleet.broker_urls.split(",")
    args = ["--redis", urls[0], "--redis", urls[1], "--namespace", NAMESPACE]
    args += ["--topic", fleet.topic.name, "--slots", str(SLOTS)]
    return [*args, "--zookeeper-connect", fleet.zookeeper.hosts] if zookeeper else args


def stranded(fleet: ProcessFleet) -> list[tuple[int, int]]:
    """(slot, broker) of every slot with messages on a broker the routing does not name."""
    found = []
    for broker, url in enumerate(fleet.broker_urls.split(",")):
        client = redis.Redis.from_url(url)
        for slot in range(SLOTS):
            keys = slot_keys(fleet.topic, slot)
            if ROUTING.broker_of_slot[slot] != broker and client.exists(keys.key(Part.MSG)):
                found.append((slot, broker))
        client.close()
    return found


async def test_ingest_and_routed_client_deliver_from_both_brokers_archive_and_audit_both(
    fleet: ProcessFleet, spark, tmp_path, capsys
):
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    source = tmp_path / "in.json"
    ingested = [f"in-{i}" for i in range(INGESTED)]
    source.write_text("".join(json.dumps({"id": i, "delay": DELAY_MS}) + "\n" for i in ingested))
    ingest = ["pipeline", "ingest", *topic_args(fleet), "--journal-max-len", str(JOURNAL_MAX_LEN)]
    ingest += ["--input", str(source), "--format", "json", "--rejects", str(tmp_path / "rej")]
    assert main(ingest) == 0
    assert json.loads(capsys.readouterr().out)["scheduled"] == INGESTED

    topic = dataclasses.replace(fleet.topic, journal_max_len=JOURNAL_MAX_LEN)
    zookeeper = ZkConnection(fleet.zookeeper.hosts)
    routed = [f"rq-{i}" for i in range(SCHEDULED)]
    with RoutedQueue.connect(fleet.broker_urls.split(","), topic, zookeeper=zookeeper) as queue:
        queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=DELAY_MS) for i in routed])
    fleet.scheduled.update([*ingested, *routed])
    assert {topic.slot_of(i) for i in fleet.scheduled} == set(range(SLOTS))  # both brokers

    output = redis.asyncio.Redis.from_url(fleet.redis_url)  # the stream sink's Redis
    try:

        async def all_delivered() -> bool:
            await fleet.read_deliveries(output)
            return not fleet.missing()

        await eventually(all_delivered, 30.0, "every message delivered", interval_s=0.05)
    finally:
        await output.aclose()
    assert stranded(fleet) == []  # each was stored, and consumed, on its slot's broker

    archive = ["pipeline", "archive", *topic_args(fleet)]
    archive += ["--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck")]

    async def acked_everywhere() -> bool:  # the ack of the last deliveries is journalled too
        assert main(archive) == 0
        capsys.readouterr()
        rows = ds.dataset(tmp_path / "out", partitioning="hive").to_table().to_pylist()
        acked = {row["id"] for row in rows if row["event"] == "acked"}
        return acked >= fleet.scheduled

    await eventually(acked_everywhere, 30.0, "every ack archived", interval_s=0.2)
    rows = ds.dataset(tmp_path / "out", partitioning="hive").to_table().to_pylist()
    assert {ROUTING.broker_of_slot[row["slot"]] for row in rows} == {0, 1}

    report = tmp_path / "audit"
    assert (
        main(["pipeline", "audit", "--input", str(tmp_path / "out"), "--output", str(report)]) == 0
    )
    [total] = json.loads(capsys.readouterr().out)["topics"]
    assert total["deliveries"] >= len(fleet.scheduled)
    assert (total["scheduled"], total["lost"], total["early"]) == (len(fleet.scheduled), 0, 0)


@pytest.mark.parametrize("command", ["ingest", "archive"])
def test_a_multi_broker_topic_without_routing_is_refused_in_one_line(
    command, redis_server, second_broker, tmp_path, capsys
):
    urls = [redis_server.url, second_broker.url]
    argv = ["pipeline", command, "--redis", urls[0], "--redis", urls[1], "--topic", "t"]
    argv += ["--slots", "4", "--output" if command == "archive" else "--rejects", str(tmp_path)]
    if command == "ingest":
        (tmp_path / "in.json").write_text('{"id": "a", "delay": 1}\n')
        argv += ["--input", str(tmp_path / "in.json"), "--format", "json"]
    else:
        argv += ["--checkpoint", str(tmp_path / "ck")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"delayq pipeline {command}: 2 brokers need their slot routing, from ZooKeeper: give "
        "--zookeeper-connect (DELAYQ_ZOOKEEPER_CONNECT)"
    )
    assert captured.out == ""


def test_one_redis_for_a_topic_routed_over_two_brokers_is_refused(
    redis_server, zookeeper_server, tmp_path, capsys
):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    observer = KazooClient(hosts=zookeeper_server.hosts)
    observer.start(timeout=10)
    routing = initial_routing(4, 2).to_json()
    observer.create(TopicPaths("default", topic).routing, routing, makepath=True)
    observer.stop()
    observer.close()
    argv = ["pipeline", "archive", "--redis", redis_server.url, "--topic", topic, "--slots", "4"]
    argv += ["--zookeeper-connect", zookeeper_server.hosts, "--output", str(tmp_path)]
    assert main([*argv, "--checkpoint", str(tmp_path / "ck")]) == 2
    assert capsys.readouterr().err.strip() == (
        "delayq pipeline archive: the routing names broker 1, but 1 broker URL(s) were given: "
        "give every broker's URL, in broker index order"
    )


def test_an_unreachable_zookeeper_is_one_line(redis_server, second_broker, tmp_path, capsys):
    urls = [redis_server.url, second_broker.url]
    argv = ["pipeline", "archive", "--redis", urls[0], "--redis", urls[1], "--topic", "t"]
    argv += ["--slots", "4", "--zookeeper-connect", "127.0.0.1:1", "--output", str(tmp_path)]
    assert main([*argv, "--checkpoint", str(tmp_path / "ck")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "delayq pipeline archive: cannot read the routing from ZooKeeper 127.0.0.1:1: "
    )


def test_a_zookeeper_connect_string_that_does_not_parse_is_one_line(tmp_path, capsys):
    """kazoo's ValueError for a port that is not a number was a traceback."""
    argv = ["pipeline", "archive", "--redis", "redis://127.0.0.1:1/0", "--topic", "t"]
    argv += ["--slots", "4", "--zookeeper-connect", "zk:notaport", "--output", str(tmp_path)]
    assert main([*argv, "--checkpoint", str(tmp_path / "ck")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("delayq pipeline archive: --zookeeper-connect zk:notaport: ")


def test_a_doubled_topic_needs_its_routing_and_is_archived_with_it(
    redis_server, zookeeper_server, tmp_path, capsys
):
    """One broker, slots doubled 2 -> 4: the generation-0 keys are only frozen epochs now. The
    documented single-broker form (one --redis, no ZooKeeper) would read those keys, find no
    journal and export nothing, run after run; it is refused in one line instead, and with
    --zookeeper-connect the new generation's journals are archived."""
    from delayq.coordination.splitting import SlotSplitter

    name = f"t-{uuid.uuid4().hex[:8]}"
    topic = Topic(name, slot_amount=2, journal_max_len=1000)
    zk = KazooClient(hosts=zookeeper_server.hosts)
    zk.start(timeout=10)
    paths = TopicPaths("default", name)
    zk.create(paths.routing, initial_routing(2, 1).to_json(), makepath=True)
    queue = Queue.from_url(redis_server.url, topic)
    try:
        for i in range(20):
            queue.schedule(f"m{i}", b"p", delay_ms=60_000)
        SlotSplitter(zk, paths, [queue]).split(4)
    finally:
        queue.close()
        zk.stop()
        zk.close()
    argv = ["pipeline", "archive", "--redis", redis_server.url, "--topic", name, "--slots", "4"]
    argv += ["--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck")]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("delayq pipeline archive: slot 0 of 4 is frozen on this broker")
    assert "--zookeeper-connect" in line

    assert main([*argv, "--zookeeper-connect", zookeeper_server.hosts]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 20  # the 20 schedules, once

    # ingest logs in as the topic's restricted user (examples/pipeline): the check is its to run
    admin = redis.Redis.from_url(redis_server.url)
    user = ["ACL", "SETUSER", "pipeline-ingest", *service_user_rules(topic), ">secret"]
    admin.execute_command(*user)
    functions.load(admin)  # the operator's part on Kubernetes: the restricted user may not
    try:
        restricted = redis_server.url.replace("redis://", "redis://pipeline-ingest:secret@")
        (tmp_path / "in.csv").write_text("id,delay\na,1\n")
        ingest = ["pipeline", "ingest", "--redis", restricted, "--topic", name, "--slots", "4"]
        ingest += ["--input", str(tmp_path / "in.csv"), "--format", "csv", "--rejects", "r"]
        assert main(ingest) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("delayq pipeline ingest: slot 0 of 4 is frozen on this broker")
    finally:
        admin.execute_command("ACL", "DELUSER", "pipeline-ingest")
        admin.close()
