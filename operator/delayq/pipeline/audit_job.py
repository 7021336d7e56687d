"""`delayq pipeline audit`: run the audit transforms and write audit.json and audit.html.

Only small results reach the driver: one row per topic and per slot, a fixed number of
histogram bins and timeline points per topic, and a few example ids per finding.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from delayq.pipeline import audit, report

HISTOGRAM_BINS = 40
TIMELINE_POINTS = 240
IDS_PER_KIND = 20


def read_journal(spark: Any, path: str) -> Any:
    """The archive's dataset; `topic` and `date` come from its Hive-style directories."""
    return spark.read.parquet(path)


def _row(row: Any) -> dict[str, Any]:
    data: dict[str, Any] = row.asDict()
    return data


def _histogram(flagged: Any, low: int, high: int) -> dict[str, Any]:
    width = max(1, math.ceil((high - low + 1) / HISTOGRAM_BINS))
    bins = max(1, math.ceil((high - low + 1) / width))
    counts = [0] * bins
    for row in audit.lateness_histogram(flagged, low, width, bins).collect():
        counts[row["bin"]] = row["count"]
    return {"low": low, "width": width, "counts": counts}


def _timeline(flagged: Any, start_ms: int, end_ms: int) -> dict[str, Any]:
    minutes = math.ceil((end_ms - start_ms + 1) / 60_000 / TIMELINE_POINTS)
    bucket_ms = 60_000 * max(1, minutes)
    rows = [r for r in audit.timeline(flagged, bucket_ms).collect() if r["bucket"] is not None]
    first = min([start_ms // bucket_ms, *(r["bucket"] for r in rows)])
    last = max([end_ms // bucket_ms, *(r["bucket"] for r in rows)])
    due, delivered = [0] * (last - first + 1), [0] * (last - first + 1)
    for r in rows:
        due[r["bucket"] - first] += r["due"]
        delivered[r["bucket"] - first] += r["delivered"]
    return {
        "start_ms": first * bucket_ms,
        "bucket_ms": bucket_ms,
        "due": due,
        "delivered": delivered,
    }


def _ids(flagged: Any, grace_ms: int) -> dict[tuple[str, str], dict[str, list[str]]]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy("namespace", "topic", "kind").orderBy("slot", "id")
    few = (
        audit.flagged_ids(flagged, grace_ms)
        .withColumn("n", F.row_number().over(first))
        .where(F.col("n") <= IDS_PER_KIND)
    )
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for row in few.orderBy("namespace", "topic", "kind", "n").collect():
        kinds = found.setdefault((row["namespace"], row["topic"]), {})
        kinds.setdefault(row["kind"], []).append(row["id"])
    return found


def build(journal: Any, grace_ms: int, source: str) -> dict[str, Any]:
    """The audit document (what audit.json holds) for a journal DataFrame."""
    from pyspark.sql import functions as F

    flagged = audit.events(journal).cache()
    slots: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in audit.metrics(flagged, grace_ms, audit.SLOT_KEYS).collect():
        slots.setdefault((row["namespace"], row["topic"]), []).append(_row(row))
    ids = _ids(flagged, grace_ms)
    topics = []
    for total in map(_row, audit.metrics(flagged, grace_ms, audit.TOPIC_KEYS).collect()):
        key = (total["namespace"], total["topic"])
        one = flagged.where((F.col("namespace") == key[0]) & (F.col("topic") == key[1]))
        low = min(0, total["lateness_min"] or 0)
        high = max(low, total["lateness_max"] or 0)
        topics.append(
            {
                "namespace": key[0],
                "topic": key[1],
                "total": total,
                "slots": slots.get(key, []),
                "ids": ids.get(key, {}),
                "plots": {
                    "lateness_histogram": _histogram(one, low, high),
                    "timeline": _timeline(one, total["start_ms"], total["end_ms"]),
                },
            }
        )
    flagged.unpersist()
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "input": source,
        "grace_ms": grace_ms,
        "topics": topics,
    }


def write(document: dict[str, Any], output: str | Path) -> None:
    directory = Path(output)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "audit.json").write_text(json.dumps(document, indent=1, sort_keys=True))
    (directory / "audit.html").write_text(report.render(document))


def run(spark: Any, input_path: str, output: str, grace_ms: int) -> dict[str, Any]:
    """Audit the dataset at `input_path`; returns the per-topic totals for the CLI summary."""
    document = build(read_journal(spark, input_path), grace_ms, input_path)
    write(document, output)
    return {
        "output": output,
        "topics": [
            {"namespace": t["namespace"], "topic": t["topic"], **t["total"]}
            for t in document["topics"]
        ],
    }
