"""The audit's numbers on a hand-built journal with known lateness and known broken promises."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from delayq.cli import main
from delayq.pipeline import audit, report

T0 = 1_800_000_000_000
END = T0 + 300_000  # the journal's last event: five minutes after the first
GRACE = 60_000
SCHEMA = (
    "namespace string, topic string, slot int, stream_id string, entry_ms long, entry_seq long, "
    "event string, id string, t long, due long, attempts int"
)


class Journal:
    """Builds journal rows in order, one stream entry id per event and slot."""

    def __init__(self) -> None:
        self.rows: list[tuple[object, ...]] = []
        self.seq = 0

    def add(self, slot, event, message_id, t, due=None, attempts=None):
        self.seq += 1
        stream_id = f"{t}-{self.seq}"
        self.rows.append(
            ("shop", "orders", slot, stream_id, t, self.seq, event, message_id, t, due, attempts)
        )

    def delivery(self, slot, message_id, due, lateness, attempts=1, ack=True):
        self.add(slot, "claimed", message_id, due + lateness, due, attempts)
        if ack:
            self.add(slot, "acked", message_id, due + lateness + 1, due, attempts)


def hand_built() -> Journal:
    j = Journal()
    # slot 0: 100 on-time-ish deliveries with lateness 1..100 ms
    for i in range(100):
        j.add(0, "scheduled", f"m{i}", T0, T0 + 1000 * i, 0)
    for i in range(100):
        j.delivery(0, f"m{i}", T0 + 1000 * i, i + 1)
    # slot 1: one early, one duplicate, one legitimate re-use, one retry, one dead, one lost
    j.add(1, "scheduled", "early", T0, T0 + 5000, 0)
    j.delivery(1, "early", T0 + 5000, -10)
    j.add(1, "scheduled", "dup", T0, T0 + 6000, 0)
    j.delivery(1, "dup", T0 + 6000, 5)
    j.delivery(1, "dup", T0 + 6000, 20_000)  # claimed again after its ack: a duplicate
    j.add(1, "scheduled", "reuse", T0, T0 + 7000, 0)
    j.delivery(1, "reuse", T0 + 7000, 5)
    j.add(1, "scheduled", "reuse", T0 + 8000, T0 + 9000, 0)  # the same id scheduled anew
    j.delivery(1, "reuse", T0 + 9000, 5)
    j.add(1, "scheduled", "retry", T0, T0 + 10_000, 0)
    j.delivery(1, "retry", T0 + 10_000, 5, ack=False)
    j.add(1, "nacked", "retry", T0 + 10_006, T0 + 10_000, 1)
    j.delivery(1, "retry", T0 + 10_006, 5, attempts=2)
    j.add(1, "scheduled", "doomed", T0, T0 + 11_000, 0)
    j.delivery(1, "doomed", T0 + 11_000, 5, ack=False)
    j.add(1, "nacked", "doomed", T0 + 11_010, T0 + 11_000, 1)
    j.add(1, "dead", "doomed", T0 + 11_010, T0 + 11_000, 1)
    j.add(1, "scheduled", "lost", T0, T0 + 12_000, 0)  # never claimed, due long ago
    j.add(1, "scheduled", "cancelled", T0, T0 + 12_000, 0)
    j.add(1, "cancelled", "cancelled", T0 + 1, None, None)
    j.add(1, "scheduled", "not-yet", T0, END - GRACE + 1, 0)  # due within the grace period
    j.add(1, "scheduled", "later", END, END + 3_600_000, 0)
    return j


@pytest.fixture(scope="module")
def journal(spark):
    rows = hand_built().rows
    return spark.createDataFrame(rows + rows[:7], SCHEMA)  # a few copies: deduplicated


@pytest.fixture(scope="module")
def by_slot(journal):
    flagged = audit.events(journal)
    rows = audit.metrics(flagged, GRACE, audit.SLOT_KEYS).collect()
    return {r.slot: r.asDict() for r in rows}


def test_lateness_percentiles_of_known_values(by_slot):
    s0 = by_slot[0]
    assert (s0["deliveries"], s0["lateness_p50"], s0["lateness_p95"]) == (100, 50, 95)
    assert (s0["lateness_p99"], s0["lateness_max"], s0["lateness_min"]) == (99, 100, 1)
    assert s0["deliveries_per_minute"] == pytest.approx(100 / 5)
    assert (s0["early"], s0["duplicates"], s0["lost"], s0["retry_rate"]) == (0, 0, 0, 0)


def test_early_duplicate_lost_retry_and_dead(by_slot):
    s1 = by_slot[1]
    assert (s1["early"], s1["duplicates"], s1["lost"]) == (1, 1, 1)
    assert s1["deliveries"] == 8  # early, dup x2, reuse x2, retry x2, doomed
    assert s1["retry_rate"] == pytest.approx(1 / 8)
    assert (s1["scheduled"], s1["dead"]) == (9, 1)
    assert s1["dead_letter_rate"] == pytest.approx(1 / 9)
    assert s1["lateness_max"] == 20_000


def test_a_doubling_of_the_slots_is_followed_by_message(spark):
    """Slots 2 -> 4: slot 0 splits into 0 and 2, its journal staying in 0. A message whose id
    lands in 2 has its schedule in 0 and its delivery in 2: one message, neither lost nor a
    fresh claim. Ids chosen by crc32(id) & 3: mover-4, again-1, gone-5 -> 2, stayer-5 -> 0,
    gone-4 -> 0 (scheduled with a custom basis into slot 1, where the split leaves it); a
    recurring occurrence goes by its schedule id: sched-0 -> 2 (its own id -> 3). Custom bases
    moving a message from 1 to 3 (the split places it by its recorded basis): based-0 -> 0 (a
    slot it never was in), moved-0 -> 1 (its first slot agrees with it, not its second)."""
    j, split = Journal(), T0 + 2000
    occurrence = f"sched-0@{T0 + 5000}"
    for message_id in ("mover-4", "again-1", "gone-5", "stayer-5", occurrence):
        j.add(0, "scheduled", message_id, T0, T0 + 5000 if message_id != "again-1" else T0, 0)
    j.add(1, "scheduled", "gone-4", T0, T0 + 5000, 0)
    for message_id in ("based-0", "moved-0"):
        j.add(1, "scheduled", message_id, T0, T0 + 5000, 0)
        j.delivery(3, message_id, T0 + 5000, 5)
    j.delivery(2, occurrence, T0 + 5000, 5)
    j.delivery(0, "again-1", T0, 5)  # acked before the doubling ...
    j.delivery(2, "again-1", T0, split + 10 - T0)  # ... and claimed again after it: a duplicate
    j.delivery(2, "mover-4", T0 + 5000, 5)
    j.delivery(0, "stayer-5", T0 + 5000, 5)
    j.delivery(1, "gone-4", T0 + 5000, 5)
    j.add(3, "scheduled", "later", END, END + 3_600_000, 0)
    flagged = audit.events(spark.createDataFrame(j.rows, SCHEMA))
    [total] = audit.metrics(flagged, GRACE, audit.TOPIC_KEYS).collect()
    assert (total["lost"], total["duplicates"], total["deliveries"]) == (1, 1, 8)
    found = {(r["kind"], r["slot"], r["id"]) for r in audit.flagged_ids(flagged, GRACE).collect()}
    assert found == {("lost", 0, "gone-5"), ("duplicate", 2, "again-1")}


def test_audit_command_writes_totals_ids_plots_and_a_self_contained_page(journal, tmp_path, capsys):
    from pyspark.sql import functions as F

    dataset, out = tmp_path / "archive", tmp_path / "out"
    journal.withColumn("date", F.lit("2027-01-15")).write.partitionBy("topic", "date").parquet(
        str(dataset)
    )
    args = ["pipeline", "audit", "--input", str(dataset), "--output", str(out)]
    assert main([*args, "--grace-ms", str(GRACE)]) == 0
    [summary] = json.loads(capsys.readouterr().out)["topics"]
    assert (summary["topic"], summary["deliveries"], summary["lost"]) == ("orders", 108, 1)

    [topic] = json.loads((out / "audit.json").read_text())["topics"]
    total = topic["total"]
    assert (total["deliveries"], total["early"], total["duplicates"], total["lost"]) == (
        108, 1, 1, 1,
    )  # fmt: skip
    assert sum(topic["plots"]["lateness_histogram"]["counts"]) == 108
    assert sum(topic["plots"]["timeline"]["delivered"]) == 108
    assert topic["ids"] == {"duplicate": ["dup"], "early": ["early"], "lost": ["lost"]}
    page = (out / "audit.html").read_text()
    _check_self_contained(page)
    assert page.count("<svg") == 2
    for text in ("Lateness histogram", "Due vs delivered", 'class="alarm"', "Broken promises"):
        assert text in page


def _check_self_contained(page: str) -> None:
    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.seen = [], set()

        def handle_starttag(self, tag, attrs):
            self.seen.add(tag)
            assert tag not in ("script", "link", "iframe", "img"), tag
            if tag not in ("meta", "line", "rect", "polyline", "br"):
                self.stack.append(tag)

        def handle_endtag(self, tag):
            if tag in ("line", "rect", "polyline"):
                return
            assert self.stack.pop() == tag, tag

    parser = Tags()
    parser.feed(page)
    assert parser.stack == []
    assert {"html", "body", "svg", "table"} <= parser.seen
    assert not re.search(r"(src|href)=\"?https?:", page)


def test_report_renders_a_clean_topic_without_alarms():
    total = {"start_ms": T0, "end_ms": END, "scheduled": 1, "dead": 0, "early": 0, "lost": 0}
    document = {
        "generated_at": "now", "grace_ms": 1, "input": "x",
        "topics": [{
            "namespace": "a", "topic": "<b>", "total": total, "slots": [], "ids": {},
            "plots": {
                "lateness_histogram": {"low": 0, "width": 1, "counts": [1]},
                "timeline": {"start_ms": T0, "bucket_ms": 60_000, "due": [1], "delivered": [1]},
            },
        }],
    }  # fmt: skip
    page = report.render(document)
    assert "No early, duplicate or lost delivery" in page
    assert "a/&lt;b&gt;" in page
    _check_self_contained(page)
