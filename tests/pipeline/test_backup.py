"""`delayq pipeline backup | restore` and the DR drill: a topic with messages waiting, in flight,
dead, a recurring schedule and a remembered outcome is backed up (as a read-only Redis user),
the broker wiped, the topic restored; a consumer then receives every message pending at the
snapshot once and none early, the dead letters and the schedule are back, a second restore
stores nothing; a time-shifted restore into another topic of another slot amount delivers
each message exactly the shift later, on the broker the target's routing (ZooKeeper) names. Real
redis-servers, real ZooKeeper, real local Spark."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient

from delayq.cli import main
from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing, initial_routing
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.pipeline.io_redis import RedisTarget
from delayq.pipeline.restore_pause import RestorePause, paused_delivery
from delayq.queue import acl, functions
from delayq.queue.acl import backup_user_rules, service_user_rules
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.consumer import Consumer
from delayq.queue.keys import Part, paused_key, slot_keys
from delayq.queue.model import Message, ScheduleRequest, State
from delayq.queue.recurrence import Recurrence
from delayq.queue.schedules import Schedule
from delayq.queue.topic import Topic

RETENTION_MS = 3_600_000
TOPIC = Topic("orders", namespace="shop", slot_amount=4, outcome_retention_ms=RETENTION_MS)
DRILL = Topic("orders-drill", namespace="staging", slot_amount=8, outcome_retention_ms=RETENTION_MS)
SHIFT_MS = 1500
PASSWORD = "drill-secret"


@pytest.fixture
def admin(redis_server: RedisServer, redis_client: redis.Redis) -> Queue:
    return Queue(redis_client, TOPIC)  # the client is the fixture's: it closes it


def _user_url(server: RedisServer, admin: redis.Redis, name: str, rules: list[str]) -> str:
    admin.execute_command("ACL", "SETUSER", name, *rules, f">{PASSWORD}")
    return server.url.replace("redis://", f"redis://{name}:{PASSWORD}@")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["pipeline", *argv, "--master", "local[2]"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _topic_args(url: str, topic: Topic) -> list[str]:
    return [
        *["--redis", url, "--namespace", topic.namespace, "--topic", topic.name],
        *["--slots", str(topic.slot_amount), "--outcome-retention-ms", str(RETENTION_MS)],
    ]


def _receive(
    queue: Queue,
    expected: set[str],
    deadline_s: float,
    broker: int = 0,
    routing: Routing | None = None,
) -> dict[str, tuple[int, int]]:
    """Claim (and ack) every slot of the broker until each expected id was delivered: id ->
    (due ms, server ms at its claim); a second delivery of an id fails the test."""
    slots = [s for s in queue.topic.slots if routing is None or routing.broker_of_slot[s] == broker]
    epochs = {slot: queue.take_over(slot) for slot in slots}
    delivered: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + deadline_s
    while not expected <= delivered.keys():
        missing = sorted(expected - delivered.keys())
        assert time.monotonic() < deadline, f"never delivered: {missing}"
        for slot, epoch in epochs.items():
            batch = queue.claim(slot, epoch, 100, 30_000)
            for message in batch.messages:
                assert message.id not in delivered, f"{message.id} delivered twice"
                delivered[message.id] = (message.due_ms, batch.now_ms)
            if batch.messages:
                queue.ack_many(batch.messages)
        time.sleep(0.05)  # a poll of the claim script: it alone decides what is due
    return delivered


def test_dr_drill_backup_wipe_restore_delivers_every_pending_message_once_never_early(
    spark, redis_server: RedisServer, redis_client: redis.Redis, admin: Queue, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    now_ms = int(redis_client.time()[0]) * 1000
    due_ms = now_ms + 4000
    waiting = [ScheduleRequest(f"w{i}", f"p{i}".encode(), at_ms=due_ms + i) for i in range(6)]
    waiting.append(ScheduleRequest("based", b"b", at_ms=due_ms, slot_basis="customer-7"))
    admin.schedule_many(waiting)
    admin.schedule_many([ScheduleRequest(i, b"x", delay_ms=0) for i in ("f1", "f2", "d1", "o1")])
    epochs = {slot: admin.take_over(slot) for slot in TOPIC.slots}
    batches = [admin.claim(slot, epoch, 10, 60_000) for slot, epoch in epochs.items()]
    claimed = {m.id: m for batch in batches for m in batch.messages}
    admin.nack(claimed["d1"].lease, reason="poison", dead=True)
    admin.ack(claimed["o1"].lease)  # f1, f2 stay in flight under their leases
    every = admin.put_schedule(Schedule("tick", Recurrence(every_ms=3_600_000), b"t"))
    occurrence = f"tick@{every.first_due_ms}"
    pending = {*(r.id for r in waiting), "f1", "f2"}

    # backup as a user that may only read
    reader = _user_url(redis_server, redis_client, "drill-reader", backup_user_rules(TOPIC))
    output = ["--output", str(tmp_path / "b")]
    backup = _run(capsys, "backup", *_topic_args(reader, TOPIC)[:8], *output)
    assert backup["items"] == {"waiting": len(pending) + 1, "dead": 1, "outcome": 1, "schedule": 1}

    redis_client.flushall()  # the broker lost everything (its functions library stays loaded)
    writer = _user_url(redis_server, redis_client, "drill-writer", service_user_rules(TOPIC))
    restore = _run(capsys, "restore", *_topic_args(writer, TOPIC), "--input", str(tmp_path / "b"))
    assert restore["counts"] == {
        "dead:CREATED": 1, "outcome:CREATED": 1, "schedule:CREATED": 1,
        "waiting:CREATED": len(pending) + 1,
    }
    again = _run(capsys, "restore", *_topic_args(writer, TOPIC), "--input", str(tmp_path / "b"))
    assert again["counts"] == {
        "dead:EXISTS": 1, "outcome:ALREADY_DONE": 1, "schedule:EXISTS": 1,
        "waiting:EXISTS": len(pending) + 1,
    }

    dead = admin.get("d1")
    assert (dead.state, dead.dead_reason) == (State.DEAD, "poison")
    assert admin.get("o1").state is State.DONE
    assert admin.get_schedule("tick").current_due_ms == every.first_due_ms
    assert admin.get("based", slot_basis="customer-7").due_ms == due_ms
    assert admin.get(occurrence, slot_basis="tick").state is State.SCHEDULED

    delivered = _receive(admin, pending, deadline_s=20)
    assert delivered.keys() == pending  # the occurrence is an hour away: not delivered
    early = {i: d for i, (due, at) in delivered.items() if at < due for d in [due]}
    assert not early
    assert {i: delivered[i][0] for i in ("f1", "f2")} == {
        "f1": claimed["f1"].due_ms, "f2": claimed["f2"].due_ms
    }  # in flight at the snapshot: waited again at the due its lease was for


def test_a_time_shifted_restore_into_a_routed_topic_of_two_brokers_delivers_exactly_shifted(
    spark, redis_server: RedisServer, second_broker: RedisServer,
    zookeeper_server: ZooKeeperServer, redis_client: redis.Redis, admin: Queue, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another namespace, twice the slots, two brokers routed in ZooKeeper: each message lands
    on the broker the routing names for its slot under 8 slots, due exactly SHIFT_MS later, and
    is delivered there, not before."""
    drill = replace(DRILL, name=f"drill-{uuid.uuid4().hex[:8]}")
    routing = initial_routing(drill.slot_amount, 2)  # slots 0-3 on broker 0, 4-7 on broker 1
    observer = KazooClient(hosts=zookeeper_server.hosts)
    observer.start(timeout=10)
    try:
        observer.create(
            TopicPaths(drill.namespace, drill.name).routing, routing.to_json(), makepath=True
        )
    finally:
        observer.stop()
    now_ms = int(redis_client.time()[0]) * 1000
    due = {f"m{i}": now_ms + 1000 + 10 * i for i in range(12)}
    admin.schedule_many([ScheduleRequest(i, b"x", at_ms=at_ms) for i, at_ms in due.items()])
    output = ["--output", str(tmp_path / "b")]
    _run(capsys, "backup", *_topic_args(redis_server.url, TOPIC)[:8], *output)
    brokers = [redis_server.url, second_broker.url]
    _run(
        capsys, "restore", *_topic_args(brokers[0], drill), "--redis", brokers[1],
        "--zookeeper-connect", zookeeper_server.hosts, "--input", str(tmp_path / "b"),
        "--shift", f"{SHIFT_MS}ms",
    )  # fmt: skip
    queues = [Queue(redis.Redis.from_url(url), drill) for url in brokers]
    try:
        on = {i: queues[routing.broker_of_slot[drill.slot_of(i)]] for i in due}
        assert {i: on[i].get(i).due_ms for i in due} == {i: at + SHIFT_MS for i, at in due.items()}
        assert {routing.broker_of_slot[drill.slot_of(i)] for i in due} == {0, 1}
        delivered: dict[str, tuple[int, int]] = {}
        for broker, queue in enumerate(queues):
            expected = {i for i in due if on[i] is queue}
            delivered |= _receive(queue, expected, deadline_s=20, broker=broker, routing=routing)
    finally:
        for queue in queues:
            queue.redis.close()
    assert all(claimed_ms >= due_ms for due_ms, claimed_ms in delivered.values())
    shifted = {i: at + SHIFT_MS for i, at in due.items()}
    assert {i: due_ms for i, (due_ms, _) in delivered.items()} == shifted


async def test_the_journal_replay_applies_what_happened_after_the_snapshot(
    spark, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After the backup: a is cancelled, b rescheduled, e (in flight at the snapshot) acked, d
    scheduled; the archive holds their events. The broker wiped, a consumer runs while the
    restore with --replay writes a, b, c and e overdue: it delivers none of them before the
    replay (the restore pauses delivery for its run: regression, it delivered a, b and e and the
    replay then moved nothing), then c alone once the restore resumes. a and e stay finished, b
    at its new due, d named as not recoverable. A second run, the topic paused by someone else
    meanwhile, stores nothing twice and leaves it paused."""
    ledger = replace(TOPIC, name="ledger", journal_max_len=10_000)
    queue = Queue(redis_client, ledger)
    now_ms = int(redis_client.time()[0]) * 1000
    queue.schedule("e", b"x", delay_ms=0)
    slot = ledger.slot_of("e")
    [message] = queue.claim(slot, queue.take_over(slot), 10, 60_000).messages
    queue.schedule_many([ScheduleRequest(i, b"x", at_ms=now_ms + 2000) for i in "abc"])
    args = _topic_args(redis_server.url, ledger)
    _run(capsys, "backup", *args[:8], "--output", str(tmp_path / "b"))
    queue.cancel("a")
    queue.reschedule("b", at_ms=now_ms + 120_000)
    queue.schedule("d", b"x", delay_ms=60_000)
    queue.ack(message.lease)
    archived = ["--output", str(tmp_path / "journal"), "--checkpoint", str(tmp_path / "cp")]
    assert main(["pipeline", "archive", *args[:8], *archived]) == 0
    capsys.readouterr()

    redis_client.flushall()
    journal = str(tmp_path / "journal")
    restore = ("restore", *args, "--input", str(tmp_path / "b"), "--replay", journal)
    delivered: list[str] = []

    async def handler(message: Message) -> None:
        delivered.append(message.id)

    consumer_client = redis.asyncio.Redis.from_url(redis_server.url)
    consumer = Consumer(AsyncQueue(consumer_client, ledger), handler)
    running = asyncio.create_task(consumer.run(slots=ledger.slots))
    try:
        report = await asyncio.to_thread(_run, capsys, *restore)
        assert delivered == []  # nothing overdue delivered before the replay was applied
        await eventually(lambda: delivered == ["c"], 10.0, "c delivered once resumed")
    finally:
        consumer.stop()
        await running
        await consumer_client.aclose()
    assert report["replay"]["finished"] == 2
    assert report["replay"]["rescheduled"] == 1
    assert report["replay"]["scheduled_after_first"] == ["d"]
    assert report["pause"] == {"paused": [0], "kept": [], "resumed": [0], "lifted": []}
    assert queue.get("a").state is State.CANCELLED
    assert queue.get("e").state is State.CANCELLED  # finished: never delivered again
    assert queue.get("b").due_ms == now_ms + 120_000
    assert queue.get("c").state is State.DONE
    assert not queue.is_paused()

    queue.pause()  # by someone else: the operator's spec.delivery.paused, the API
    again = await asyncio.to_thread(_run, capsys, *restore)
    assert set(again["counts"]) == {"waiting:EXISTS", "waiting:ALREADY_DONE"}
    assert again["pause"] == {"paused": [], "kept": [0], "resumed": [], "lifted": []}
    assert queue.is_paused()
    assert [queue.get(i).state for i in "ace"] == [State.CANCELLED, State.DONE, State.CANCELLED]
    assert queue.get("b").due_ms == now_ms + 120_000


@pytest.mark.parametrize(
    ("left", "fails_after_writing", "paused_after"),
    [
        ("restore", False, False),  # a killed restore's pause: taken over, resumed
        ("", True, True),  # a failure once writing began: the replay's work is not done
        ("", False, False),  # a failure before the first write: resumed
        ("1", True, True),  # someone else's pause: never resumed
    ],
)
def test_the_restore_pause_is_resumed_only_by_its_holder_and_kept_on_a_late_failure(
    redis_server: RedisServer, redis_client: redis.Redis, left: str, fails_after_writing: bool,
    paused_after: bool,
) -> None:
    """`paused_delivery` without Spark, as the topic's service user (the restore's login): what
    it pauses, takes over and resumes, and what a failure leaves; a failure after writing began
    says so in one line."""
    queue = Queue(redis_client, TOPIC)
    if left:
        redis_client.set(paused_key(TOPIC), left)
    functions.load(redis_client)  # the operator's part: the resume is a function (resume-1)
    writer = _user_url(redis_server, redis_client, "pauser", service_user_rules(TOPIC))
    target = RedisTarget((writer,), TOPIC.namespace, TOPIC.name, TOPIC.slot_amount, 1024)
    said: list[str] = []
    held: list[RestorePause] = []

    def failing_job() -> None:
        with paused_delivery(target, said.append) as pause:
            held.append(pause)
            assert queue.is_paused()
            if fails_after_writing:
                pause.seen_at_s = time.monotonic()  # no consumer to wait for
                pause.before_writing()
            raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        failing_job()
    [pause] = held
    assert queue.is_paused() is paused_after
    assert pause.paused == ([] if left == "1" else [0])
    if left != "1" and fails_after_writing:
        assert said == [
            "delivery stays paused on broker(s) 0: the restore stopped after it began writing; "
            "run it again to finish (it stores nothing twice) and resume"
        ]
    else:
        assert said == []


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["backup", "--topic", "nosuch", "--output", "{tmp}/b"], 2, "has no key on its brokers"),
        (["backup", "--topic", "orders", "--output", "{tmp}"], 2, "exists: give a new directory"),
        (["restore", "--topic", "orders", "--input", "{tmp}/none"], 1, "no backup there"),
    ],
)
def test_bad_input_is_one_line_before_spark_starts(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str,
) -> None:
    Queue(redis_client, TOPIC).schedule("kept", b"x", delay_ms=60_000)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    common = ["--redis", redis_server.url, "--namespace", "shop", "--slots", "4"]
    assert main(["pipeline", *args, *common]) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert says in err


@pytest.mark.parametrize("shift", ["-1h", "tomorrow", "1h-", "999999999d"])
def test_a_wrong_shift_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shift: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["pipeline", "restore", "--topic", "t", "--slots", "1", "--input", str(tmp_path),
              "--shift", shift])  # fmt: skip
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "--shift" in err.strip().splitlines()[-1]


def test_a_slot_moving_under_a_spark_task_is_one_line(
    spark, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A slot frozen for a move (its tombstone: the move is over) while the backup reads it
    stops the job in one line that says to run it again, not a worker's traceback."""
    Queue(redis_client, TOPIC).schedule("kept", b"x", delay_ms=60_000)
    moved = next(slot for slot in TOPIC.slots if slot != TOPIC.slot_of("kept"))
    redis_client.set(slot_keys(TOPIC, moved).key(Part.EPOCH), "moving:7")
    argv = [*_topic_args(redis_server.url, TOPIC)[:8], "--output", str(tmp_path / "b")]
    with pytest.MonkeyPatch.context() as patch:  # the move ends after the driver's own check
        patch.setattr("delayq.pipeline.cli._check_not_frozen", lambda routed: None)
        assert main(["pipeline", "backup", *argv, "--master", "local[2]"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"delayq pipeline backup: slot {moved} moved during the backup: run it again (it "
        "follows the new routing)"
    ), err
    assert not any("Traceback" in line for line in err)


def test_the_scheduled_backups_command_reads_the_topic_file_and_keeps_the_newest(
    spark, redis_server: RedisServer, redis_client: redis.Redis, admin: Queue, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the operator's CronJob runs (kube/builders/backup.py): the topic from its
    topic.json, the brokers as the read-only backup user from DELAYQ_BROKER_URLS, each run
    into a new directory, the oldest beyond --keep deleted with an older unfinished run."""
    from delayq.kube.builders.common import BuildContext
    from delayq.kube.builders.service import topic_file
    from delayq.kube.spec import parse_spec

    admin.schedule_many([ScheduleRequest(f"m{i}", b"p", delay_ms=60_000) for i in range(5)])
    spec = parse_spec(TOPIC.name, TOPIC.namespace, {"slotAmount": TOPIC.slot_amount})
    document = replace(topic_file(spec, BuildContext(), TOPIC.slot_amount), zookeeper_connect="")
    config = tmp_path / "topic.json"
    config.write_text(document.to_json())
    reader = _user_url(redis_server, redis_client, acl.BACKUP_USER, backup_user_rules(TOPIC))
    monkeypatch.setenv("DELAYQ_BROKER_URLS", reader)
    into = tmp_path / "backups" / "orders"
    crashed = into / "backup-20000101T000000000Z"  # a run that died before its manifest
    (crashed / "items").mkdir(parents=True)
    argv = ("backup", "--config", str(config), "--into", str(into), "--keep", "1")
    first = _run(capsys, *argv)
    assert first["items"] == {"waiting": 5}
    assert first["deleted"] == [crashed.name]
    second = _run(capsys, *argv)
    assert second["deleted"] == [Path(first["output"]).name]
    assert [path.name for path in into.iterdir()] == [Path(second["output"]).name]
    assert second["items"] == {"waiting": 5}
