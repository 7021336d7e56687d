"""`delayq pipeline archive`: per-slot journal streams -> Parquet, exactly once, then trimmed.

Order of effects per page of a stream: write the Parquet file (atomic rename), then the
checkpoint (atomic rename), then XTRIM MINID past the page (with the next page's read, and
after the last page). A crash anywhere leaves either nothing written, or a file without its
checkpoint. The second case is recovered, not repeated: file names carry (namespace, slot,
first id, last id), and before reading a stream the job rolls its checkpoint forward to the last
id already present in the dataset. So a re-run exports nothing twice even when new entries moved
the page boundaries, and nothing is trimmed from Redis before it is on disk.

The streams are read on the driver with pyarrow, without Spark: bounded per slot (MAXLEN), and a
JVM would only add start-up time. Each slot is read from the broker the routing names for it
(`RoutedQueue`, watched). A slot moved between two runs carries its journal, entry ids and all,
to its new broker (`queue/slot_copy.py`), so the checkpoint (by stream key, not by broker) goes
on from there; entries trimmed from the old broker after the copy are past the checkpoint. A
slot a doubling under way switched (`RoutedQueue.stored_in`) is read in its halves, as once the
doubling ended: the lower half holds the old slot's journal, ids and all (its checkpoint rolled
forward from the dataset's files of that slot number), the upper half only what was written
since. The
dataset is plain Hive-partitioned Parquet (`topic=<t>/date=<yyyy-mm-dd>/`) that Spark, pyarrow
or DuckDB read as is.

Gaps: the engine's own `MAXLEN` trims a journal that is not archived often enough, and what it
trims past the checkpoint is gone. Each page is read in one MULTI with the trim of what is
archived and XINFO STREAM, so the stream then holds exactly the entries after the checkpoint,
and its `entries-added` counter (Redis 7) numbers them: the checkpoint keeps that number for its
last entry, and entries added after it that are no longer in the stream were trimmed unarchived.
They are reported (`ArchiveSummary.gaps`), never silently skipped.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis

from delayq.queue.keys import Part, slot_keys
from delayq.queue.topic import Topic

if TYPE_CHECKING:
    from delayq.coordination.routed_queue import RoutedQueue
    from delayq.queue.client import Queue

DEFAULT_PAGE_SIZE = 10_000
EntryId = tuple[int, int]  # (ms, seq) of a stream entry id, ordered as Redis orders them
Entry = tuple[bytes, dict[bytes, bytes]]  # as redis-py returns one XRANGE entry

COLUMNS = (
    ("namespace", "string"),
    ("slot", "int32"),
    ("stream_id", "string"),
    ("entry_ms", "int64"),
    ("entry_seq", "int64"),
    ("event", "string"),
    ("id", "string"),
    ("t", "int64"),
    ("due", "int64"),
    ("attempts", "int32"),
)


@dataclass(frozen=True)
class Gap:
    """Entries of a stream trimmed (by the engine's MAXLEN) before they were archived."""

    stream: str
    after: str | None  # the last archived entry id before them (None: the stream's start)
    missing: int  # how many
    resumed_at: str | None  # the first entry archived after them (None: none left yet)

    def line(self) -> str:
        start = f"after {self.after}" if self.after else "at the stream's start"
        resumed = f", archiving resumed at {self.resumed_at}" if self.resumed_at else ""
        return f"{self.stream}: {self.missing} entries {start} were trimmed unarchived{resumed}"


@dataclass
class ArchiveSummary:
    streams: int = 0
    entries: int = 0
    files: int = 0
    trimmed: int = 0
    recovered: int = 0  # streams whose checkpoint was rolled forward after a crash
    seconds: float = 0.0
    gaps: list[Gap] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        text = (
            f"archive: {self.entries} entries from {self.streams} streams in {self.files} files, "
            f"trimmed {self.trimmed}, {self.seconds:.1f} s"
        )
        if self.gaps:
            missing = sum(gap.missing for gap in self.gaps)
            text += (
                f"; LOST {missing} entries the journal's MAXLEN trimmed before they were "
                f"archived, in {len(self.gaps)} streams: archive more often"
            )
        return "\n".join([text, *(f"archive: gap: {gap.line()}" for gap in self.gaps)])


def parse_id(entry_id: str | bytes) -> EntryId:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(entry_id: EntryId) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def successor(entry_id: EntryId) -> EntryId:
    """The smallest id after `entry_id`: XTRIM MINID keeps ids >= it, so trims up to entry_id."""
    return entry_id[0], entry_id[1] + 1


def file_name(namespace: str, slot: int, first: EntryId, last: EntryId) -> str:
    """Deterministic per (namespace, slot, first id, last id): a rewrite replaces, never adds."""
    return f"{namespace}_{slot:05d}_{format_id(first)}_{format_id(last)}.parquet"


def _ms(value: bytes | None) -> int | None:
    """A journal time field: empty for events without one (cancelled, purged)."""
    if not value:
        return None
    text = value.decode()
    return int(text) if text.lstrip("-").isdigit() else int(float(text))


def rows_of(namespace: str, slot: int, entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """Journal entries (fields e, id, t, due, a of lua/includes/journal.lua) as flat rows."""
    rows = []
    for raw_id, fields in entries:
        ms, seq = parse_id(raw_id)
        attempts = _ms(fields.get(b"a"))
        rows.append(
            {
                "namespace": namespace,
                "slot": slot,
                "stream_id": format_id((ms, seq)),
                "entry_ms": ms,
                "entry_seq": seq,
                "event": fields.get(b"e", b"").decode(),
                "id": fields.get(b"id", b"").decode(),
                "t": _ms(fields.get(b"t")),
                "due": _ms(fields.get(b"due")),
                "attempts": attempts,
            }
        )
    return rows


def utc_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_durably(write: Any, target: Path) -> None:
    """Write through `write(tmp_path)`, fsync, rename over `target`: all of it or nothing."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=target.suffix)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


@dataclass(frozen=True)
class Position:
    """Where a stream's archive stands: its last archived entry and that entry's number in the
    stream's `entries-added` count (None when unknown: rolled forward from the dataset, a
    checkpoint written before the count was kept, a Redis before 7)."""

    last: EntryId
    added: int | None = None


class Checkpoint:
    """The position per stream key, one JSON file per topic: `{key: {"id", "added"}}` (a bare
    id string, as written before the count was kept, is read as a position without it)."""

    def __init__(self, directory: str | Path, topic: Topic) -> None:
        self.path = Path(directory) / f"{topic.namespace}.{topic.name}.json"

    def load(self) -> dict[str, Position]:
        if not self.path.exists():
            return {}
        data: dict[str, Any] = json.loads(self.path.read_text())
        return {
            key: Position(parse_id(value))
            if isinstance(value, str)
            else Position(parse_id(value["id"]), value.get("added"))
            for key, value in data.items()
        }

    def save(self, positions: dict[str, Position]) -> None:
        data = {key: {"id": format_id(p.last), "added": p.added} for key, p in positions.items()}
        text = json.dumps(data, indent=1, sort_keys=True)
        _replace_durably(lambda tmp: Path(tmp).write_text(text), self.path)


class Dataset:
    """The Parquet dataset of one topic: `<root>/topic=<name>/date=<day>/<file_name>`."""

    def __init__(self, root: str | Path, topic: Topic) -> None:
        self.topic = topic
        self.directory = Path(root) / f"topic={topic.name}"

    def write(self, slot: int, rows: list[dict[str, Any]]) -> int:
        """One file per date the page spans; returns how many files were written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in COLUMNS])
        by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_date[utc_date(row["entry_ms"])].append(row)
        for day, day_rows in by_date.items():
            first = (day_rows[0]["entry_ms"], day_rows[0]["entry_seq"])
            last = (day_rows[-1]["entry_ms"], day_rows[-1]["entry_seq"])
            name = file_name(self.topic.namespace, slot, first, last)
            table = pa.Table.from_pylist(day_rows, schema=schema)
            _replace_durably(
                lambda tmp, t=table: pq.write_table(t, tmp), self.directory / f"date={day}" / name
            )
        return len(by_date)

    def last_written(self, slot: int) -> EntryId | None:
        """The highest entry id of this slot already in the dataset (from the file names)."""
        pattern = f"date=*/{self.topic.namespace}_{slot:05d}_*.parquet"
        ids = [parse_id(path.stem.rsplit("_", 1)[1]) for path in self.directory.glob(pattern)]
        return max(ids, default=None)


def _page(
    client: redis.Redis, key: str, last: EntryId | None, count: int
) -> tuple[list[Entry], int, int | None]:
    """Atomically: trim what is archived (ids up to `last`), then read the next `count` entries
    and the stream's `entries-added` count (None before Redis 7). Returns the entries, how many
    the trim removed, and the count of entries added before the stream's head: entries that
    were added after `last` and are gone, when it exceeds `last`'s own number."""
    read = client.pipeline(transaction=True)
    if last is not None:
        read.xtrim(key, minid=format_id(successor(last)), approximate=False)
    read.xinfo_stream(key)
    read.xrange(key, min=f"({format_id(last)}" if last else "-", max="+", count=count)
    *trim, info, entries = read.execute()
    added = info.get("entries-added")
    head = None if added is None else int(added) - int(info["length"])
    return cast(list[Entry], entries), int(trim[0]) if trim else 0, head


def archive_slot(
    queue: Queue,
    dataset: Dataset,
    checkpoint: Checkpoint,
    positions: dict[str, Position],
    slot: int,
    page_size: int,
    summary: ArchiveSummary,
) -> None:
    """Recover the slot's position, export its new entries page by page, trimming what is
    archived, and report entries trimmed before they were archived (a `Gap`). `slot` is of
    `queue`'s topic (its slot amount and key generation)."""
    client = queue.redis
    key = slot_keys(queue.topic, slot).key(Part.JOURNAL)
    saved = positions.get(key)
    written = dataset.last_written(slot)
    if written is not None and (saved is None or written > saved.last):
        # a file landed but its checkpoint did not: its entry's number is unknown
        saved = positions[key] = Position(written)
        checkpoint.save(positions)
        summary.recovered += 1
    if not client.exists(key):
        return
    summary.streams += 1
    # a stream never archived has lost what was added before its head (its number 0 is known)
    last, added = (None, 0) if saved is None else (saved.last, saved.added)
    while True:
        entries, trimmed, head = _page(client, key, last, page_size)
        summary.trimmed += trimmed
        if head is not None and added is not None and head > added:
            first = format_id(parse_id(entries[0][0])) if entries else None
            after = format_id(last) if last else None
            summary.gaps.append(Gap(key, after, head - added, first))
        if not entries:
            break
        rows = rows_of(dataset.topic.namespace, slot, entries)
        summary.files += dataset.write(slot, rows)
        summary.entries += len(rows)
        last = parse_id(entries[-1][0])
        added = None if head is None else head + len(entries)
        positions[key] = Position(last, added)
        checkpoint.save(positions)
    if last is not None:
        trim_to = format_id(successor(last))
        summary.trimmed += int(client.xtrim(key, minid=trim_to, approximate=False))


def archive(
    brokers: RoutedQueue,
    output: str | Path,
    checkpoint_dir: str | Path,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> ArchiveSummary:
    """Export every slot's new journal entries of the topic, each slot read where the
    (watched) routing stores it; see the module docstring."""
    started = time.monotonic()
    topic = brokers.topic
    checkpoint = Checkpoint(checkpoint_dir, topic)
    dataset = Dataset(output, topic)
    positions = checkpoint.load()
    summary = ArchiveSummary()
    for slot in topic.slots:
        queue, stored = brokers.stored_in(slot)
        for part in stored:
            archive_slot(queue, dataset, checkpoint, positions, part, page_size, summary)
    summary.seconds = time.monotonic() - started
    return summary
