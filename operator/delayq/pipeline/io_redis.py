"""The ingest's Redis side: writes one Spark partition with the engine's batch schedule.

Runs inside the Python workers (`mapPartitions`): rows in, `Queue.schedule_many` out, so
routing, validation, encoding and the Lua calls are the engine's own (one call per slot per
chunk, pipelined per batch). It returns its counts as a result object, not only through an
accumulator: accumulators may count a retried task twice, the collected results cannot.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq.queue import plans
from delayq.queue.client import Queue
from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import Topic

DEFAULT_BATCH_ROWS = 5000  # rows per pipelined round trip: ~5 Lua calls of 1000 per slot
TOO_FAR_REASON = "due beyond the Redis server's now + the maximum delay (TOO_FAR)"


@dataclass(frozen=True)
class RedisTarget:
    """Where the ingest writes: a Redis URL and the topic settings the engine needs."""

    url: str
    namespace: str
    topic: str
    slot_amount: int
    max_payload_bytes: int
    journal_max_len: int = 0
    outcome_retention_ms: int = 0

    def to_topic(self) -> Topic:
        return Topic(
            self.topic,
            namespace=self.namespace,
            slot_amount=self.slot_amount,
            max_payload_bytes=self.max_payload_bytes,
            journal_max_len=self.journal_max_len,
            outcome_retention_ms=self.outcome_retention_ms,
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


def requests_of(rows: Iterable[Any]) -> list[ScheduleRequest]:
    """Spark rows of `transforms.GOOD_COLUMNS` -> engine schedule requests.

    Rows are unpacked by position: a Row's by-name lookup searches its field list every time.
    """
    return [
        ScheduleRequest(
            id=message_id,
            payload=_payload(payload),
            delay_ms=delay_ms,
            at_ms=due_ms,
            slot_basis=slot_basis,
            headers=headers or {},
        )
        for message_id, payload, due_ms, delay_ms, slot_basis, headers, _slot in rows
    ]


def _payload(value: str | bytes | bytearray | None) -> str | bytes:
    if value is None:
        return b""
    return bytes(value) if isinstance(value, bytearray) else value


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


def _write(queue: Queue, requests: list[ScheduleRequest], result: PartitionResult) -> None:
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
) -> Callable[[Iterator[Any]], Iterator[PartitionResult]]:
    """The `mapPartitions` function writing one partition; `progress` an optional accumulator."""

    def write(rows: Iterator[Any]) -> Iterator[PartitionResult]:
        result = PartitionResult()
        queue = Queue.from_url(target.url, target.to_topic())
        try:
            while batch := list(itertools.islice(rows, batch_rows)):
                _write(queue, requests_of(batch), result)
                if progress is not None:
                    progress.add(len(batch))
        finally:
            queue.close()
        yield result

    return write
