"""`delayq pipeline backup | restore`: a topic's pending state to Parquet and back, on Spark.

Backup: one Spark task per group of slots reads each slot at one instant (`queue/backup.py`
`snapshot`: one MULTI of reads on the slot's broker, no script, no write, delivery going on in
the other slots) and the items go to `<output>/items` (Parquet), the run's facts to
`<output>/manifest` (one JSON line: topic, slot amount, the broker clock at the start and the
end, counts). "Consistent" means per slot: each slot's items are that slot at one instant, so a
message is in exactly one state; two slots are read at different instants (a message never
crosses slots: nothing is lost or doubled between them).

Restore: the items, optionally shifted in time (`shifted`), are written create-only by the
engine's `restore-13` transition into the slot their route names under the target topic's
slot amount, on the broker its routing names. Create-only makes a second run store nothing
twice; a waiting message keeps its original due (plus the shift), so it is never delivered
early; the target's limits hold (payload size here, maximum delay and maxPending in the script).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from delayq.coordination.routing import by_broker
from delayq.pipeline.io_redis import RedisTarget
from delayq.queue import plans, produce_plans
from delayq.queue.backup import Item, Kind, SlotMovedError, shifted, snapshot
from delayq.queue.codec import decode_record
from delayq.queue.codes import Code, NotFoundError
from delayq.queue.keys import slot_keys

ITEMS, MANIFEST = "items", "manifest"
TOO_LARGE = "TOO_LARGE"  # a payload over the target topic's maxPayloadBytes: not restored


def item_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("kind", pa.string()),
            ("id", pa.string()),
            ("ms", pa.int64()),
            ("value", pa.binary()),
            ("reason", pa.string()),
            ("basis", pa.string()),
            ("route", pa.string()),
            ("taken_ms", pa.int64()),
        ]
    )


def _item_batch(items: list[Item]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([item._asdict() for item in items], schema=item_schema())


def slot_reader(target: RedisTarget, slot_amount: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function of the backup: batches of slot numbers (column `id`, as
    `spark.range` makes them) in, each slot's items out, read from the broker the routing names
    for the slot (a routed client per task, watching the routing like ingest's writers). The
    slots are those of `slot_amount`: a doubling since the job started fails it (the numbers
    would name other keys)."""

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        with target.connect() as routed:
            for batch in batches:
                for slot in batch.column("id").to_pylist():
                    if routed.topic.slot_amount != slot_amount:
                        raise SlotMovedError("the slots doubled during the backup")
                    client = routed.queues[routed.routing[slot]].redis
                    items = snapshot(client, slot_keys(routed.topic, slot))
                    if items:
                        yield _item_batch(items)

    return read


@dataclass
class BackupSummary:
    slots: int
    items: dict[str, int]
    started_ms: int  # the first broker's clock when the first slot was about to be read
    finished_ms: int  # ... and after the last slot was read
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "items": self.items,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        counts = ", ".join(f"{self.items.get(kind, 0)} {kind}" for kind in Kind)
        return f"backup: {self.slots} slots, {counts} in {self.seconds:.1f} s"


def _server_ms(target: RedisTarget) -> int:
    with target.connect() as routed:
        seconds, micros = routed.queues[0].redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


def backup(spark: Any, target: RedisTarget, output: str) -> BackupSummary:
    """Snapshot every slot of the topic to `output` (items and manifest); returns the counts."""
    import json

    from pyspark.sql.functions import col
    from pyspark.sql.pandas.types import from_arrow_schema

    started, started_ms = time.monotonic(), _server_ms(target)
    with target.connect() as routed:
        slot_amount = routed.topic.slot_amount
    tasks = max(1, min(slot_amount, 2 * int(spark.sparkContext.defaultParallelism)))
    slots = spark.range(slot_amount, numPartitions=tasks)
    reader = slot_reader(target, slot_amount)
    items = slots.mapInArrow(reader, from_arrow_schema(item_schema()))
    items.write.mode("errorifexists").parquet(f"{output}/{ITEMS}")
    written = spark.read.parquet(f"{output}/{ITEMS}")
    per_kind = written.groupBy(col("kind")).count().collect()
    counts = {row["kind"]: int(row["count"]) for row in per_kind}
    summary = BackupSummary(slot_amount, counts, started_ms, _server_ms(target), 0.0)
    manifest = {
        "namespace": target.namespace,
        "topic": target.topic,
        "slot_amount": slot_amount,
        **summary.as_dict(),
    }
    manifest["items"] = json.dumps(counts, sort_keys=True)
    spark.createDataFrame([manifest]).coalesce(1).write.mode("errorifexists").json(
        f"{output}/{MANIFEST}"
    )
    summary.seconds = time.monotonic() - started
    return summary


@dataclass
class RestoreResult:
    """What one restore writer did: counts by (kind, code name) and the first refused ids."""

    counts: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)

    def add(self, item: Item, code: str) -> None:
        self.counts[f"{item.kind}:{code}"] += 1
        answered = code in (Code.CREATED.name, Code.EXISTS.name, Code.ALREADY_DONE.name)
        if not answered and len(self.refused) < 10:
            self.refused.append(f"{item.id} ({code})")


def result_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("count", pa.int64()), ("refused", pa.string())])


def _fits(item: Item, max_payload_bytes: int) -> bool:
    if item.kind not in (Kind.WAITING, Kind.DEAD):
        return True
    return len(decode_record(item.value).payload) <= max_payload_bytes


def restore_writer(
    target: RedisTarget, shift_ms: int, chunk: int = plans.MAX_MESSAGES_PER_CALL * 5
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function of the restore: item batches in, counts out."""
    topic_limits = target.to_topic()

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        result = RestoreResult()
        with target.connect() as routed:
            for batch in batches:
                rows = batch.to_pylist()
                items = [shifted(Item(**row), shift_ms) for row in rows]
                keep = []
                for item in items:
                    if item.kind == Kind.OUTCOME and topic_limits.outcome_retention_ms == 0:
                        result.add(item, "NOT_REMEMBERED")  # the target keeps no outcomes
                    elif not _fits(item, topic_limits.max_payload_bytes):
                        result.add(item, TOO_LARGE)
                    else:
                        keep.append(item)
                for start in range(0, len(keep), chunk):
                    _restore(routed, keep[start : start + chunk], result)
        keys = sorted(result.counts)
        yield pa.RecordBatch.from_pylist(
            [{"key": key, "count": result.counts[key], "refused": None} for key in keys]
            + [{"key": "", "count": 0, "refused": ref} for ref in result.refused],
            schema=result_schema(),
        )

    return write


def _restore(routed: Any, items: list[Item], result: RestoreResult) -> None:
    topic = routed.topic
    groups = by_broker(routed.routing, (topic.slot_of(item.route) for item in items))
    for broker, positions in groups.items():
        chosen = [items[p] for p in positions]
        for item, outcome in zip(
            chosen, routed.queues[broker].run(produce_plans.restore(topic, chosen)), strict=True
        ):
            result.add(item, outcome.code.name)


@dataclass
class RestoreSummary:
    read: int
    counts: dict[str, int]  # "<kind>:<code>" -> items
    refused: list[str]  # the first ids refused (and why)
    shift_ms: int
    seconds: float

    def restored(self, kind: str) -> int:
        return self.counts.get(f"{kind}:{Code.CREATED.name}", 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "counts": self.counts,
            "refused": self.refused,
            "shift_ms": self.shift_ms,
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        restored = ", ".join(f"{self.restored(kind)} {kind}" for kind in Kind)
        present = sum(n for key, n in self.counts.items() if key.endswith(":EXISTS"))
        done = sum(n for key, n in self.counts.items() if key.endswith(":ALREADY_DONE"))
        refused = self.read - sum(self.restored(kind) for kind in Kind) - present - done
        text = (
            f"restore: read {self.read}, restored {restored}; already present {present}, "
            f"already done {done}, not restored {refused} in {self.seconds:.1f} s"
        )
        return text + (f" (first: {', '.join(self.refused)})" if self.refused else "")


def restore(spark: Any, source: str, target: RedisTarget, shift_ms: int) -> RestoreSummary:
    """Restore the backup at `source` into `target` (any slot amount), shifted by shift_ms."""
    from pyspark.sql.pandas.types import from_arrow_schema

    started = time.monotonic()
    items = spark.read.parquet(f"{source}/{ITEMS}")
    with target.connect() as routed:
        slot_amount = routed.topic.slot_amount
    tasks = max(1, min(slot_amount, 2 * int(spark.sparkContext.defaultParallelism)))
    results = (
        items.repartition(tasks, "route")
        .mapInArrow(restore_writer(target, shift_ms), from_arrow_schema(result_schema()))
        .collect()
    )
    counts: Counter[str] = Counter()
    for row in results:
        if row["key"]:
            counts[row["key"]] += int(row["count"])
    refused = [row["refused"] for row in results if row["refused"]][:10]
    return RestoreSummary(
        sum(counts.values()), dict(sorted(counts.items())), refused, shift_ms,
        time.monotonic() - started,
    )


#: A message's last journal event that finished it: not to be delivered again after a restore.
FINISHING_EVENTS = ("acked", "cancelled", "purged", "dropped")


@dataclass
class ReplaySummary:
    """What the journal archive told after the backup's slots were read: messages of the backup
    that finished since (cancelled in the restored topic, so not delivered again), moved since
    (rescheduled to their journaled due) and what it cannot restore (the journal carries no
    payload: messages scheduled after the snapshot; messages that went dead since stay waiting)."""

    finished: int = 0
    rescheduled: int = 0
    scheduled_after: list[str] = field(default_factory=list)
    died_after: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "finished": self.finished,
            "rescheduled": self.rescheduled,
            "scheduled_after": len(self.scheduled_after),
            "scheduled_after_first": self.scheduled_after[:10],
            "died_after": len(self.died_after),
            "died_after_first": self.died_after[:10],
        }

    def line(self) -> str:
        return (
            f"replay: {self.finished} finished after the snapshot (not delivered again), "
            f"{self.rescheduled} rescheduled; not recoverable from the journal (no payload): "
            f"{len(self.scheduled_after)} scheduled after it, {len(self.died_after)} died after it "
            "(left waiting)"
        )


def replay(
    spark: Any, archive: str, source: str, target: RedisTarget, shift_ms: int
) -> ReplaySummary:
    """Apply the archived journal since each slot's snapshot to the restored topic: per id of
    the backup, its last event after its slot was read (`taken_ms`) decides; an id the backup
    lacks whose first event after the snapshot is `scheduled` is reported. Events at the very
    millisecond of the read count as after it (a cancel of what the backup holds, or a
    reschedule to the due it has, changes nothing then)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    manifest = spark.read.json(f"{source}/{MANIFEST}").first()
    items = spark.read.parquet(f"{source}/{ITEMS}").where(F.col("kind") == Kind.WAITING.value)
    events = (
        spark.read.parquet(archive)
        .where(F.col("namespace") == manifest["namespace"])
        .where(F.col("topic") == manifest["topic"])
        .select("id", "entry_ms", "entry_seq", "event", "due")
    )
    taken = items.select("id", "route", "value", "taken_ms")
    after = events.join(taken, "id", "left").where(
        F.col("taken_ms").isNull() | (F.col("entry_ms") >= F.col("taken_ms"))
    )
    order = Window.partitionBy("id").orderBy(F.col("entry_ms").desc(), F.col("entry_seq").desc())
    last = after.withColumn("n", F.row_number().over(order)).where(F.col("n") == 1).collect()
    summary = ReplaySummary()
    with target.connect() as routed:
        for row in sorted(last, key=lambda r: r["id"]):
            if row["taken_ms"] is None:
                if row["event"] == "scheduled":
                    summary.scheduled_after.append(row["id"])
                continue
            item = shifted(
                Item(Kind.WAITING, row["id"], row["due"], row["value"], None, "", row["route"]),
                shift_ms,
            )
            try:  # NotFoundError: a replay run before did it (idempotent)
                if row["event"] in FINISHING_EVENTS:
                    routed.cancel(item.id, item.route)
                    summary.finished += 1
                elif row["event"] == "rescheduled" and row["due"] is not None:
                    routed.reschedule(item.id, at_ms=row["due"] + shift_ms, slot_basis=item.route)
                    summary.rescheduled += 1
            except NotFoundError:
                pass
            if row["event"] == "dead":
                summary.died_after.append(row["id"])
    return summary
