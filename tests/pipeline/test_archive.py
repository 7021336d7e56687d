"""`delayq pipeline archive` on a real journal written by the engine, with a crash and restart."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import cast

import pyarrow.dataset as ds
import pytest
from kazoo.client import KazooClient

from delayq.cli import main
from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SlotSplitter
from delayq.local.waiting import wait_until
from delayq.pipeline import archive as A
from delayq.pipeline import audit, audit_job
from delayq.queue.client import Queue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.topic import Topic

TOPIC = Topic("orders", namespace="shop", slot_amount=4, journal_max_len=10_000)


def _lifecycle(queue: Queue, prefix: str, count: int) -> None:
    """Schedule, claim, ack half, nack the other half, claim and ack again: a real journal."""
    for i in range(count):
        queue.schedule(f"{prefix}{i}", b"p", delay_ms=0)
    for slot in queue.topic.slots:
        epoch = queue.take_over(slot)
        messages = queue.claim(slot, epoch).messages
        for n, message in enumerate(messages):
            if n % 2:
                queue.nack(message.lease)
            else:
                queue.ack(message.lease)
        for message in queue.claim(slot, epoch).messages:
            queue.ack(message.lease)


def _journal(redis_client) -> dict[str, list[str]]:
    out = {}
    for slot in TOPIC.slots:
        key = slot_keys(TOPIC, slot).key(Part.JOURNAL)
        out[key] = [entry_id.decode() for entry_id, _ in redis_client.xrange(key)]
    return out


def _archived(output) -> list[tuple[int, str]]:
    table = ds.dataset(str(output), format="parquet", partitioning="hive").to_table()
    return sorted(zip(table["slot"].to_pylist(), table["stream_id"].to_pylist(), strict=True))


def _expected(journals: list[dict[str, list[str]]]) -> list[tuple[int, str]]:
    return sorted(
        (int(key.split("/")[-1].split("}")[0]), entry_id)
        for journal in journals
        for key, ids in journal.items()
        for entry_id in ids
    )


@pytest.fixture
def queue(redis_server, redis_client):
    queue = Queue.from_url(redis_server.url, TOPIC)
    yield queue
    queue.close()


def test_archive_exports_once_then_trims(queue, redis_server, redis_client, tmp_path, capsys):
    _lifecycle(queue, "a", 40)
    before = _journal(redis_client)
    args = [
        "pipeline", "archive", "--redis", redis_server.url, "--namespace", "shop",
        "--topic", "orders", "--slots", "4", "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "ck"), "--page-size", "7",
    ]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    total = sum(len(ids) for ids in before.values())
    assert total > 40 * 3  # scheduled, claimed, acked|nacked each; the nacked claimed, acked again
    assert (summary["entries"], summary["trimmed"]) == (total, total)
    assert _archived(tmp_path / "out") == _expected([before])
    assert all(redis_client.xlen(key) == 0 for key in before)
    events = ds.dataset(str(tmp_path / "out"), partitioning="hive").to_table()
    assert set(events["topic"].to_pylist()) == {"orders"}
    assert set(events["event"].to_pylist()) == {"scheduled", "claimed", "acked", "nacked"}

    assert main(args) == 0  # nothing new: nothing exported twice
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert _archived(tmp_path / "out") == _expected([before])


def test_crash_between_write_and_checkpoint_loses_and_duplicates_nothing(
    queue, redis_server, redis_client, tmp_path, monkeypatch
):
    _lifecycle(queue, "b", 30)
    first = _journal(redis_client)
    output, checkpoint = tmp_path / "out", tmp_path / "ck"

    def crash(self, positions):
        raise RuntimeError("simulated crash after the Parquet write, before the checkpoint")

    with monkeypatch.context() as patch:
        patch.setattr(A.Checkpoint, "save", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            A.archive(_brokers(redis_server), output, checkpoint, page_size=5)
    assert len(_archived(output)) == 5  # one page landed, its checkpoint did not
    assert not (checkpoint / "shop.orders.json").exists()
    assert sum(redis_client.xlen(key) for key in first) == sum(map(len, first.values()))

    _lifecycle(queue, "c", 10)  # new entries move every page boundary of the re-run
    second = _journal(redis_client)
    summary = A.archive(_brokers(redis_server), output, checkpoint, page_size=5)
    assert summary.recovered == 1
    archived = _archived(output)
    assert len(archived) == len(set(archived))  # no duplicates
    assert archived == _expected([second])  # no loss: `second` still holds all of `first`
    saved = json.loads((checkpoint / "shop.orders.json").read_text())
    assert {key: p["id"] for key, p in saved.items()} == {
        key: ids[-1] for key, ids in second.items() if ids
    }
    assert summary.gaps == []


def test_entries_trimmed_before_they_were_archived_are_reported(
    queue, redis_server, redis_client, tmp_path
):
    """The journal's MAXLEN trims what the archive has not read yet: the gap is reported per
    stream with the number of entries lost, which with those archived makes up every entry the
    engine added; a re-run reports it no more."""
    output, checkpoint = tmp_path / "out", tmp_path / "ck"
    _lifecycle(queue, "d", 20)
    assert A.archive(_brokers(redis_server), output, checkpoint).gaps == []
    keys = [slot_keys(TOPIC, slot).key(Part.JOURNAL) for slot in TOPIC.slots]
    added_before = {k: redis_client.xinfo_stream(k)["entries-added"] for k in keys}

    short = Queue.from_url(redis_server.url, dataclasses.replace(TOPIC, journal_max_len=20))
    for i in range(800):  # the engine's MAXLEN ~ 20 trims whole stream nodes (100 entries)
        short.schedule(f"e{i}", b"p", delay_ms=60_000)
    short.close()
    added = {k: redis_client.xinfo_stream(k)["entries-added"] - added_before[k] for k in keys}

    summary = A.archive(_brokers(redis_server), output, checkpoint, page_size=7)
    gaps = {gap.stream: gap for gap in summary.gaps}
    assert gaps, "800 schedules over 4 slots trim every journal"
    assert summary.entries + sum(g.missing for g in gaps.values()) == sum(added.values())
    for gap in gaps.values():
        assert gap.after is not None
        assert gap.resumed_at is not None
        assert A.parse_id(gap.after) < A.parse_id(gap.resumed_at)
    assert "LOST" in summary.line()
    assert len(summary.line().splitlines()) == 1 + len(gaps)

    assert A.archive(_brokers(redis_server), output, checkpoint).gaps == []


def test_a_checkpoint_of_bare_ids_is_read_without_entry_numbers(tmp_path):
    (tmp_path / "shop.orders.json").write_text(json.dumps({"k": "5-1"}))
    assert A.Checkpoint(tmp_path, TOPIC).load() == {"k": A.Position((5, 1))}


def _brokers(redis_server):
    """The topic's one broker, routed (nothing to close: its connections are the pool's)."""
    return RoutedQueue.connect([redis_server.url], TOPIC)


def test_rows_of_parses_journal_fields():
    entries = [
        (b"1700000000000-3", {b"e": b"claimed", b"id": b"m", b"t": b"1700000000000",
                              b"due": b"1699999999990", b"a": b"2"}),
        (b"1700000000001-0", {b"e": b"cancelled", b"id": b"n", b"t": b"1700000000001",
                              b"due": b"", b"a": b""}),
    ]  # fmt: skip
    rows = A.rows_of("shop", 3, entries)
    assert rows[0] | {} == {
        "namespace": "shop", "slot": 3, "stream_id": "1700000000000-3", "entry_ms": 1700000000000,
        "entry_seq": 3, "event": "claimed", "id": "m", "t": 1700000000000,
        "due": 1699999999990, "attempts": 2,
    }  # fmt: skip
    assert (rows[1]["due"], rows[1]["attempts"]) == (None, None)
    assert A.successor(A.parse_id("5-9")) == (5, 10)
    assert A.file_name("shop", 3, (1, 0), (2, 5)) == "shop_00003_1-0_2-5.parquet"


def test_audit_of_a_real_archived_journal_finds_no_broken_promise(
    spark, queue, redis_server, tmp_path
):
    _lifecycle(queue, "r", 24)
    A.archive(_brokers(redis_server), tmp_path / "out", tmp_path / "ck")
    journal = audit_job.read_journal(spark, str(tmp_path / "out"))
    [total] = audit.metrics(audit.events(journal), 60_000, audit.TOPIC_KEYS).collect()
    assert (total.topic, total.namespace, total.scheduled) == ("orders", "shop", 24)
    assert total.deliveries > 24  # the nacked half is delivered twice
    assert (total.early, total.duplicates, total.lost, total.dead) == (0, 0, 0, 0)
    assert 0 <= total.lateness_p50 <= total.lateness_max


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("notaurl", "--redis notaurl: Redis URL must specify one of the following schemes"),
        ("redis://:secret@127.0.0.1:abc/0", "--redis redis://:***@127.0.0.1:abc/0: Port could"),
        ("redis://:secret@[::1/0", "--redis <a URL that does not parse>: Invalid IPv6 URL"),
    ],
)
def test_a_redis_url_that_does_not_parse_is_one_line_without_its_password(
    url, said, tmp_path, capsys
):
    """redis-py's ValueError was a traceback (and redacting a bad port raised another)."""
    argv = ["pipeline", "archive", "--redis", url, "--topic", "t", "--slots", "4"]
    assert main([*argv, "--output", str(tmp_path), "--checkpoint", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"delayq pipeline archive: {said}")
    assert "secret" not in line


def _journals(queue: Queue) -> list[tuple[int, str]]:
    """(slot, entry id) of every journal entry of `queue`'s topic."""
    return [
        (slot, entry_id.decode())
        for slot in queue.topic.slots
        for entry_id, _ in cast(
            list[A.Entry], queue.redis.xrange(slot_keys(queue.topic, slot).key(Part.JOURNAL))
        )
    ]


def test_a_slot_a_doubling_switched_is_archived_from_its_halves(
    redis_server, redis_client, zookeeper_server, tmp_path
):
    """A doubling under way listed every old slot in `doubledSlots` (its freeze done, the
    routing not switched yet): the entries written into the halves since, and those copied
    into the lower halves unarchived, are archived once each, named by the halves' slot
    numbers, as once the doubling ended (before: the frozen old slots were read, the halves'
    entries missed until the doubling ended)."""
    topic = dataclasses.replace(TOPIC, name=f"o{uuid.uuid4().hex[:8]}")
    paths = TopicPaths(topic.namespace, topic.name)
    zk = KazooClient(hosts=zookeeper_server.hosts)
    zk.start(timeout=10)
    zk.create(paths.routing, Routing(4, 1, (0,) * 4).to_json(), makepath=True)
    queue = Queue.from_url(redis_server.url, topic)
    routed = RoutedQueue.connect(
        [redis_server.url], topic, zookeeper=ZkConnection(zookeeper_server.hosts)
    )
    output, checkpoint = tmp_path / "out", tmp_path / "ck"
    try:
        _lifecycle(queue, "a", 20)
        first = _journals(queue)
        A.archive(routed, output, checkpoint)
        _lifecycle(queue, "u", 8)  # not archived before the doubling: copied to the lower halves
        unarchived = [entry for entry in _journals(queue) if entry not in first]
        splitter = SlotSplitter(zk, paths, [queue])
        current = splitter.start(8)
        while current is not None and current[0].step is not Step.SWITCH:
            current = splitter.step(*current)
        splitter.release()
        wait_until(lambda: routed.stored_in(3)[1] == [3, 7], 10, "slot 3 listed")
        halves = Queue(queue.redis, dataclasses.replace(topic, slot_amount=8, slot_generation=1))
        _lifecycle(halves, "b", 20)
        written = [entry for entry in _journals(halves) if entry not in unarchived]
        assert {slot for slot, _ in written} == set(range(8))
        summary = A.archive(routed, output, checkpoint)
        assert summary.entries == len(unarchived) + len(written)
        assert _archived(output) == sorted(first + unarchived + written)
    finally:
        routed.close()
        queue.close()
        zk.stop()
        zk.close()
