"""The ingest's Redis side: writes one Spark partition with the engine's batch schedule.

Runs inside the Python workers (`mapInArrow`): Arrow batches in, `Queue.schedule_many` out, so
routing, validation, encoding and the Lua calls are the engine's own (one call per slot per
chunk, pipelined per batch). It returns its counts as rows, not only through an accumulator:
accumulators may count a retried task twice, the rows of the collected result cannot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.queue import plans
from delayq.queue.client import Queue
from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import Topic
from delayq.pipeline import transforms as T

DEFAULT_BATCH_ROWS = 5000  # rows per pipelined round trip: ~5 Lua calls of 1000 per slot

# One summary row per partition (kind "summary") and one row per message the engine refused
# (kind "reject", e.g. TOO_FAR against the server clock): the writer's whole result.
OUTCOME_SCHEMA = (
    "kind string, id string, reason string, source string, "
    "rows long, scheduled long, existing long, rejected long"
)
TOO_FAR_REASON = "due beyond the Redis server's now + the maximum delay (TOO_FAR)"


@dataclass(frozen=True)
class RedisTarget:
    """Where the ingest writes: a Redis URL and the topic settings the engine needs."""

    url: str
    namespace: str
    topic: str
    slot_amount: int
    max_payload_bytes: int
    journal_maxlen: int = 0

    def to_topic(self) -> Topic:
        return Topic(
            self.topic,
            namespace=self.namespace,
            slot_amount=self.slot_amount,
            max_payload_bytes=self.max_payload_bytes,
            journal_maxlen=self.journal_maxlen,
        )


@dataclass
class _Counts:
    rows: int = 0
    scheduled: int = 0
    existing: int = 0
    rejected: int = 0


def requests_of(batch: Any) -> list[ScheduleRequest]:
    """Arrow record batch of `transforms.GOOD_COLUMNS` -> engine schedule requests."""
    columns = [batch.column(name).to_pylist() for name in T.GOOD_COLUMNS[:-1]]
    return [
        ScheduleRequest(
            id=message_id,
            payload=b"" if payload is None else payload,
            delay_ms=delay_ms,
            at_ms=due_ms,
            slot_basis=slot_basis,
            headers=dict(headers) if headers else {},
        )
        for message_id, payload, due_ms, delay_ms, slot_basis, headers in zip(*columns, strict=True)
    ]


def _source(request: ScheduleRequest) -> str:
    return json.dumps(
        {"id": request.id, "due_ms": request.at_ms, "delay_ms": request.delay_ms},
        sort_keys=True,
    )


def _refused(topic: Topic, requests: Sequence[ScheduleRequest]) -> dict[int, str]:
    """Positions of the requests the engine's validation refuses, with its message.

    Only reached when a batch fails to build; the Spark-side rules are tested to agree with the
    engine, so this is the safety net that turns a disagreement into rejects, not a failed job.
    """
    refused: dict[int, str] = {}
    for index, request in enumerate(requests):
        try:
            plans.schedule(topic, [request], Mode.CREATE)
        except InvalidMessageError as error:
            refused[index] = str(error)
    return refused


def _write(queue: Queue, requests: list[ScheduleRequest], counts: _Counts) -> list[dict[str, Any]]:
    """Schedule one batch (create-only, so a re-run finds EXISTS); the rows it rejected."""
    counts.rows += len(requests)
    rejects: list[dict[str, Any]] = []
    try:
        results = queue.schedule_many(requests, Mode.CREATE)
    except InvalidMessageError:
        refused = _refused(queue.topic, requests)
        rejects = [
            {"id": requests[i].id, "reason": reason, "source": _source(requests[i])}
            for i, reason in refused.items()
        ]
        requests = [r for i, r in enumerate(requests) if i not in refused]
        results = queue.schedule_many(requests, Mode.CREATE) if requests else []
    for request, result in zip(requests, results, strict=True):
        if result.code is Code.CREATED:
            counts.scheduled += 1
        elif result.code is Code.EXISTS:
            counts.existing += 1
        else:
            reason = TOO_FAR_REASON if result.code is Code.TOO_FAR else result.code.name
            rejects.append({"id": request.id, "reason": reason, "source": _source(request)})
    counts.rejected += len(rejects)
    return rejects


def partition_writer(
    target: RedisTarget, batch_rows: int = DEFAULT_BATCH_ROWS, progress: Any = None
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function writing one partition; `progress` an optional accumulator."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        counts = _Counts()
        rejects: list[dict[str, Any]] = []
        queue = Queue.from_url(target.url, target.to_topic())
        try:
            for batch in batches:
                for start in range(0, batch.num_rows, batch_rows):
                    chunk = batch.slice(start, batch_rows)
                    rejects += _write(queue, requests_of(chunk), counts)
                    if progress is not None:
                        progress.add(chunk.num_rows)
        finally:
            queue.close()
        summary = {"kind": "summary", **vars(counts)}
        rows = [summary, *({"kind": "reject", **reject} for reject in rejects)]
        yield pa.RecordBatch.from_pylist(rows, schema=_outcome_schema())

    return write


def _outcome_schema() -> Any:
    import pyarrow as pa

    fields = [(name, kind) for name, kind in (f.split() for f in OUTCOME_SCHEMA.split(", "))]
    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[kind]) for name, kind in fields])
