"""`delayq pipeline ingest`: read a file, validate, route by slot, schedule into Redis.

The job evaluates the writer exactly once (one `collect` of its small outcome rows), so a
message is scheduled once per run, and create-only scheduling makes a re-run find every id
already present (EXISTS) instead of scheduling it twice. The writer receives the good rows as
Arrow record batches (`mapInArrow`): columns, not one pickled `Row` per message.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from delayq.pipeline import transforms as T
from delayq.pipeline.io_redis import RedisTarget, partition_writer, result_schema

FORMATS = ("parquet", "csv", "json")
REJECTS_SCHEMA = "id string, reason string, source string"
PROGRESS_INTERVAL_S = 5.0


@dataclass(frozen=True)
class IngestSummary:
    read: int
    scheduled: int
    already_present: int
    already_done: int  # finished within the topic's outcomeRetention: not scheduled again
    rejected: int
    seconds: float

    @property
    def rate(self) -> float:
        """Rows written to Redis per second (scheduled, already present or already done)."""
        written = self.scheduled + self.already_present + self.already_done
        return written / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate_msg_per_s": round(self.rate, 1)}

    def line(self) -> str:
        return (
            f"ingest: read {self.read}, scheduled {self.scheduled}, already present "
            f"{self.already_present}, already done {self.already_done}, rejected "
            f"{self.rejected} in {self.seconds:.1f} s "
            f"({self.rate:,.0f} msg/s)"
        )


def read_input(spark: Any, path: str, fmt: str) -> Any:
    """Parquet, CSV (RFC 4180: header line, "" escapes a quote; all columns text) or JSON Lines.

    A CSV is read with one text column past its header's (`transforms.EXTRA_FIELDS`): Spark's
    PERMISSIVE mode drops a line's fields beyond the schema, so an unquoted comma in a payload
    would otherwise schedule the message with the payload cut short; with the column, such a
    line is a reject. A JSON line that does not parse fills Spark's `_corrupt_record`, the
    same way (`transforms.MALFORMED`).
    """
    if fmt == "parquet":
        return spark.read.parquet(path)
    if fmt == "csv":
        from pyspark.sql.types import StringType, StructField, StructType

        reader = spark.read.options(header=True, escape='"', mode="PERMISSIVE")
        header = reader.csv(path).columns  # names only: the first line, no scan
        columns = [StructField(name, StringType()) for name in [*header, T.EXTRA_FIELDS]]
        return reader.schema(StructType(columns)).csv(path)
    if fmt == "json":
        return spark.read.json(path)
    raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def default_partitions(spark: Any, slot_amount: int) -> int:
    """A few tasks per core (progress, skew) but never more than there are slots."""
    return max(1, min(slot_amount, 4 * int(spark.sparkContext.defaultParallelism)))


def ingest(
    spark: Any,
    source: Any,
    target: RedisTarget,
    rejects_path: str,
    mapping: Mapping[str, str] | None = None,
    partitions: int | None = None,
    now_ms: int | None = None,
    report: Callable[[str], None] | None = None,
) -> IngestSummary:
    """Schedule the good rows of `source`, write every bad one with its reason to `rejects_path`.

    `report` receives a progress line every few seconds (rows written so far and the rate).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    started = time.monotonic()
    validated = T.validate(
        T.canonical(source, mapping or {}),
        target.max_payload_bytes,
        int(time.time() * 1000) if now_ms is None else now_ms,
    )
    good = T.by_slot(
        T.good_rows(validated, target.slot_amount),
        partitions or default_partitions(spark, target.slot_amount),
    )
    written = spark.sparkContext.accumulator(0)
    writer = partition_writer(target, progress=written)
    with _Progress(spark, written, started, report):
        results = good.mapInArrow(writer, from_arrow_schema(result_schema())).collect()
    late = [(r.id, r.reason, r.source) for result in results for r in result.rejects]
    rejects = T.rejected_rows(validated).unionByName(spark.createDataFrame(late, REJECTS_SCHEMA))
    # repartition, not coalesce: coalesce(1) would also run the validating scan in one task
    rejects.repartition(1).write.mode("overwrite").json(rejects_path)
    rejected = spark.read.schema(REJECTS_SCHEMA).json(rejects_path).count()
    return IngestSummary(
        read=sum(r.rows for r in results) + rejected - len(late),
        scheduled=sum(r.scheduled for r in results),
        already_present=sum(r.existing for r in results),
        already_done=sum(r.already_done for r in results),
        rejected=rejected,
        seconds=time.monotonic() - started,
    )


class _Progress:
    """Reports rows written (an accumulator: live, approximate) and task progress while the job
    runs; the final counts come from the writers' results instead."""

    def __init__(
        self, spark: Any, written: Any, started: float, report: Callable[[str], None] | None
    ) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.written, self.started, self.report = written, started, report
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="ingest-progress")

    def __enter__(self) -> _Progress:
        if self.report is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        assert self.report is not None
        while not self.done.wait(PROGRESS_INTERVAL_S):
            rows, seconds = self.written.value, time.monotonic() - self.started
            self.report(
                f"ingest: {rows} rows written in {seconds:.0f} s ({rows / seconds:,.0f}/s), "
                f"tasks {self._tasks()}"
            )

    def _tasks(self) -> str:
        """Done/total tasks of the running stages: moves before the first writer task ends."""
        stages = [self.tracker.getStageInfo(i) for i in self.tracker.getActiveStageIds()]
        stages = [stage for stage in stages if stage is not None]
        done = sum(stage.numCompletedTasks for stage in stages)
        return f"{done}/{sum(stage.numTasks for stage in stages)}"


def stderr_report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
