"""The ingest's Redis side: writes one Spark partition with the engine's batch schedule.

Runs inside the Python workers (`mapInArrow`): Arrow record batches in,
`RoutedQueue.schedule_many` out, so validation, encoding and the Lua calls are the engine's own
(one call per broker and 1,000 rows), and each row goes to its slot's
broker by the routing the writer watches in ZooKeeper: a slot moved during the job refuses its
rows with SLOT_MOVING, which the client sends again to the new broker (create-only, so nothing
is stored twice); a doubling of the slot amount refuses them the same way, and the client slots
them again under the new amount (its slot grouping is redone on every pass, never stale). The
rows arrive column by column, as Arrow batches, and become
`ScheduleRequest`s straight from the columns: no pickled `Row` per row (pickling them cost the
JVM about 3 s of CPU per million rows more). It returns its counts as one result row, not only
through an accumulator: accumulators may count a retried task twice, the collected results
cannot.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing_watch import ZkConnection
from delayq.pipeline import transforms as T
from delayq.queue import produce_plans
from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import Topic

DEFAULT_BATCH_ROWS = 5000  # rows per pipelined round trip: ~5 Lua calls of 1000 per slot
TOO_FAR_REASON = "due beyond the Redis server's now + the maximum delay (TOO_FAR)"


@dataclass(frozen=True)
class RedisTarget:
    """Where the ingest writes: the topic's brokers (Redis URLs, broker index order), where its
    routing is (ZooKeeper; one broker needs none) and the topic settings the engine needs.
    Plain data: Spark ships it to every writer, which routes each row by the watched routing."""

    urls: tuple[str, ...]
    namespace: str
    topic: str
    slot_amount: int
    max_payload_bytes: int
    journal_max_len: int = 0
    outcome_retention_ms: int = 0
    zookeeper: ZkConnection | None = None
    limits_max_pending: int = 0  # what restore obeys (ingest leaves it to the schedule script)

    def connect(self) -> RoutedQueue:
        """The routed client of the topic (RoutingError: a multi-broker topic, no routing)."""
        return RoutedQueue.connect(self.urls, self.to_topic(), zookeeper=self.zookeeper)

    def to_topic(self) -> Topic:
        return Topic(
            self.topic,
            namespace=self.namespace,
            slot_amount=self.slot_amount,
            max_payload_bytes=self.max_payload_bytes,
            journal_max_len=self.journal_max_len,
            outcome_retention_ms=self.outcome_retention_ms,
            limits_max_pending=self.limits_max_pending,
        )


@dataclass(frozen=True)
class Reject:
    """A row the engine refused at write time, for the rejects file."""

    id: str
    reason: str
    source: str


@dataclass
class PartitionResult:
    """What one partition's writer did: the counts and the rows the engine refused."""

    rows: int = 0
    scheduled: int = 0
    existing: int = 0
    already_done: int = 0
    rejects: list[Reject] = field(default_factory=list)

    def to_arrow(self) -> Any:
        """This result as the one-row Arrow batch of `result_schema()`."""
        import pyarrow as pa

        return pa.RecordBatch.from_pylist([asdict(self)], schema=result_schema())


def result_schema() -> Any:
    """The Arrow schema of a `PartitionResult` row, what the writer yields to the driver."""
    import pyarrow as pa

    reject = pa.struct([(f.name, pa.string()) for f in fields(Reject)])
    return pa.schema(
        [
            (f.name, pa.list_(reject) if f.name == "rejects" else pa.int64())
            for f in fields(PartitionResult)
        ]
    )


def requests_of(batch: Any) -> list[ScheduleRequest]:
    """An Arrow batch of `transforms.GOOD_COLUMNS` -> engine schedule requests.

    Each column is converted to Python values in one call (`to_pylist`), and the requests are
    built from the columns side by side: no per-row object other than the request itself (and
    the headers' dict, parsed from the JSON text `transforms.good_rows` sends, where present).
    """
    headers = [None if text is None else json.loads(text) for text in _values(batch, T.HEADERS)]
    payloads = [b"" if value is None else value for value in _values(batch, T.PAYLOAD)]
    no_expiry = itertools.repeat(None)  # the ingest has no expiry columns: the topic's applies
    return list(
        map(
            ScheduleRequest,
            _values(batch, T.ID),
            payloads,
            _values(batch, T.DELAY_MS),
            _values(batch, T.DUE_MS),
            _values(batch, T.SLOT_BASIS),
            headers,
            no_expiry,
            no_expiry,
            _values(batch, T.PRIORITY),
            _values(batch, T.GROUP),
        )
    )


def _values(batch: Any, name: str) -> list[Any]:
    return list(batch.column(name).to_pylist())


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
            produce_plans.schedule(topic, [request], Mode.CREATE)
        except InvalidMessageError as error:
            refused[index] = str(error)
    return refused


def _write(queue: RoutedQueue, requests: list[ScheduleRequest], result: PartitionResult) -> None:
    """Schedule one batch create-only, so a re-run finds EXISTS instead of scheduling twice."""
    result.rows += len(requests)
    try:
        outcomes = queue.schedule_many(requests, Mode.CREATE)
    except InvalidMessageError:
        refused = _refused(queue.topic, requests)
        result.rejects += [
            Reject(requests[i].id, reason, _source(requests[i])) for i, reason in refused.items()
        ]
        requests = [r for i, r in enumerate(requests) if i not in refused]
        outcomes = queue.schedule_many(requests, Mode.CREATE) if requests else []
    for request, outcome in zip(requests, outcomes, strict=True):
        if outcome.code is Code.CREATED:
            result.scheduled += 1
        elif outcome.code is Code.EXISTS:
            result.existing += 1
        elif outcome.code is Code.ALREADY_DONE:
            result.already_done += 1
        else:
            reason = TOO_FAR_REASON if outcome.code is Code.TOO_FAR else outcome.code.name
            result.rejects.append(Reject(request.id, reason, _source(request)))


def partition_writer(
    target: RedisTarget, batch_rows: int = DEFAULT_BATCH_ROWS, progress: Any = None
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function writing one partition: Arrow batches of
    `transforms.GOOD_COLUMNS` in, one row of `result_schema()` out, schedule calls of
    `batch_rows` requests whatever size Spark's batches have; `progress` an optional
    accumulator."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        result = PartitionResult()
        queue = target.connect()
        requests = itertools.chain.from_iterable(map(requests_of, batches))
        try:
            while batch := list(itertools.islice(requests, batch_rows)):
                _write(queue, batch, result)
                if progress is not None:
                    progress.add(len(batch))
        finally:
            queue.close()
        yield result.to_arrow()

    return write
