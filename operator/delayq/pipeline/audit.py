"""Pure DataFrame transforms of the delivery audit over the archived lifecycle journal.

Input: the archive's columns (namespace, topic, slot, stream_id, entry_ms, entry_seq, event, id,
t, due, attempts). Within a slot the stream entry id (entry_ms, entry_seq) is the total order of
events (one Lua call at a time per slot), so every per-message question is a window over the
message's events in that order.

A message keeps its slot number across a slot move (its journal moves with it, entry ids and
all), but not across a doubling of the slots: slot s of N splits into s and s + N, the whole
journal stays in s, and a message whose basis lands in s + N has its later events there. Such a
message's slots all agree with the low bits of its id's CRC32 (`lineage`), so its events are
one window: (namespace, topic, id) plus, for a message whose custom slot basis put it in slots
its id does not agree with, the first of those slots (each later one's low bits).

Definitions (docs/pipeline.md repeats them for readers of the report):
- lateness = t - due of each `claimed` event (due is the instant that delivery was for);
  early = lateness < 0, which the engine promises never happens;
- duplicate = a `claimed` event after an `acked` of the same id with no new `scheduled` between;
- lost = an id whose last event leaves it waiting in `store` (scheduled, rescheduled, redriven,
  expired, nacked, givenback: a nack's `due` is its retry's due) with its due more than
  `grace_ms` before the end of the topic's journal;
- retry rate = claims with attempts > 1 / claims; dead-letter rate = ids dead / ids scheduled;
- deliveries per minute = claims / the topic journal's time span in minutes (at least one).
"""

from __future__ import annotations

from typing import Any

DataFrame = Any  # pyspark.sql.DataFrame
Column = Any  # pyspark.sql.Column

TOPIC_KEYS = ("namespace", "topic")
SLOT_KEYS = ("namespace", "topic", "slot")
MESSAGE_KEYS = ("namespace", "topic", "slot", "id")
OCCURRENCE = "^(.*)@[0-9]+$"  # a recurring schedule's occurrence id: `<schedule id>@<due ms>`
LINEAGE = "lineage"  # -1 for a slot the id agrees with, else the slot: see the module docstring
MESSAGE = ("namespace", "topic", "id", LINEAGE)  # one message, across the doublings of its slot
QUANTILES = (0.5, 0.95, 0.99)
PERCENTILE_ACCURACY = 10_000  # exact below 10k values per group, 0.01% rank error above
# events that leave the id waiting in store
WAITING_EVENTS = ("scheduled", "rescheduled", "redriven", "expired", "nacked", "givenback")


def _pos() -> Column:
    from pyspark.sql import functions as F

    return F.struct("entry_ms", "entry_seq")


def lineage() -> Column:
    """-1 when the event's slot is one its id routes to under some slot amount (the slot's
    bits equal the low bits of crc32(id)), or, for a recurring occurrence
    `<schedule id>@<due ms>`, one its schedule id routes to, or when such a slot of the same
    id is one it may have come from (an ancestor: its bits the low bits of the event's slot);
    else the lowest ancestor among the id's slots (the event's own slot at least).

    A doubling moves a message from s to the half its basis routes to (`queue/slot_split.py`
    `Halves.of_message`): its id, an occurrence's schedule, or the custom slot basis recorded
    with it, which the journal does not carry. So a message with a custom basis may live in
    slots its id does not agree with, each the previous one's descendant. The mask is a
    slot's bits smeared right (5 -> 7), exact in integers. A window over the id's events.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    slot = F.col("slot").cast("long")

    def smeared(value: Column) -> Column:
        for shift in (1, 2, 4, 8, 16):
            value = value.bitwiseOR(F.shiftright(value, shift))
        return value

    def agrees(basis: Column) -> Column:
        return F.crc32(basis.cast("binary")).bitwiseAND(smeared(slot)) == slot

    def ancestors(slots: Column) -> Column:
        return F.filter(slots, lambda m: slot.bitwiseAND(smeared(m)) == m)

    occurrence = F.col("id").rlike(OCCURRENCE)
    schedule = F.regexp_extract(F.col("id"), OCCURRENCE, 1)
    own = agrees(F.col("id")) | (occurrence & agrees(schedule))
    whole = Window.partitionBy(*TOPIC_KEYS, "id")
    agreeing = F.collect_set(F.when(own, slot)).over(whole)
    others = F.collect_set(F.when(~own, slot)).over(whole)
    return F.when(own | (F.size(ancestors(agreeing)) > 0), F.lit(-1).cast("long")).otherwise(
        F.array_min(ancestors(others))
    )


def events(journal: DataFrame) -> DataFrame:
    """Deduplicated journal (by stream entry) with `lateness`, a `duplicate` flag and the
    message's `lineage` per event.

    The archive writes each entry once; deduplicating here as well makes the audit correct
    even over a dataset assembled by other means (copies, overlapping exports, a slot's journal
    archived under two key generations around a doubling: same slot, same entry ids).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    unique = journal.dropDuplicates([*SLOT_KEYS, "stream_id"]).withColumn(LINEAGE, lineage())
    before = (
        Window.partitionBy(*MESSAGE)
        .orderBy("entry_ms", "entry_seq")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    last_ack = F.max(F.when(F.col("event") == "acked", _pos())).over(before)
    last_schedule = F.max(F.when(F.col("event") == "scheduled", _pos())).over(before)
    claimed = F.col("event") == "claimed"
    duplicate = (
        claimed & last_ack.isNotNull() & (last_schedule.isNull() | (last_ack > last_schedule))
    )
    return unique.select(
        "*",
        F.when(claimed, F.col("t") - F.col("due")).alias("lateness"),
        duplicate.alias("duplicate"),
    )


def windows(journal: DataFrame) -> DataFrame:
    """Per topic: the journal's first and last event time (the observation window)."""
    from pyspark.sql import functions as F

    return journal.groupBy(*TOPIC_KEYS).agg(
        F.min("t").alias("start_ms"), F.max("t").alias("end_ms")
    )


def lost(flagged: DataFrame, grace_ms: int) -> DataFrame:
    """Messages of `events(journal)` left waiting past due + grace at the end of the journal:
    (keys, id, due), the slot being that of the message's last event."""
    from pyspark.sql import functions as F

    last = flagged.groupBy(*MESSAGE).agg(
        F.max_by(F.struct("event", "due", "t", "slot"), _pos()).alias("last")
    )
    due = F.when(F.col("last.event") == "expired", F.col("last.t")).otherwise(F.col("last.due"))
    return (
        last.join(windows(flagged), list(TOPIC_KEYS))
        .where(F.col("last.event").isin(*WAITING_EVENTS) & (due < F.col("end_ms") - grace_ms))
        .select(*TOPIC_KEYS, F.col("last.slot").alias("slot"), "id", due.alias("due"))
    )


def metrics(flagged: DataFrame, grace_ms: int, keys: tuple[str, ...]) -> DataFrame:
    """The figures per `keys` (TOPIC_KEYS or SLOT_KEYS) over `events(journal)`, a row a group."""
    from pyspark.sql import functions as F

    claimed = F.col("event") == "claimed"
    lateness = F.col("lateness")

    def count_if(condition: Column) -> Column:
        return F.sum(F.when(condition, 1).otherwise(0))

    figures = flagged.groupBy(*keys).agg(
        count_if(claimed).alias("deliveries"),
        F.percentile_approx(lateness, list(QUANTILES), PERCENTILE_ACCURACY).alias("quantiles"),
        F.min(lateness).alias("lateness_min"),
        F.max(lateness).alias("lateness_max"),
        count_if(claimed & (lateness < 0)).alias("early"),
        count_if(claimed & (F.col("attempts") > 1)).alias("retries"),
        count_if(F.col("duplicate")).alias("duplicates"),
        F.countDistinct(F.when(F.col("event") == "scheduled", F.col("id"))).alias("scheduled"),
        F.countDistinct(F.when(F.col("event") == "dead", F.col("id"))).alias("dead"),
    )
    lost_counts = lost(flagged, grace_ms).groupBy(*keys).agg(F.count("*").alias("lost"))
    minutes = F.greatest(F.lit(1.0), (F.col("end_ms") - F.col("start_ms")) / 60_000.0)
    return (
        figures.join(lost_counts, list(keys), "left")
        .join(windows(flagged), list(TOPIC_KEYS))
        .select(
            *keys,
            "deliveries",
            *(
                F.col("quantiles")[i].alias(f"lateness_p{round(q * 100)}")
                for i, q in enumerate(QUANTILES)
            ),
            "lateness_min",
            "lateness_max",
            (F.col("deliveries") / minutes).alias("deliveries_per_minute"),
            (F.col("retries") / F.greatest(F.lit(1), "deliveries")).alias("retry_rate"),
            (F.col("dead") / F.greatest(F.lit(1), "scheduled")).alias("dead_letter_rate"),
            "early",
            "duplicates",
            F.coalesce(F.col("lost"), F.lit(0)).alias("lost"),
            "scheduled",
            "dead",
            "start_ms",
            "end_ms",
        )
        .orderBy(*keys)
    )


def flagged_ids(flagged: DataFrame, grace_ms: int) -> DataFrame:
    """The ids behind the early, duplicate and lost counts of `events(journal)`: keys, id, kind."""
    from pyspark.sql import functions as F

    early = flagged.where(F.col("lateness") < 0).select(*MESSAGE_KEYS, F.lit("early").alias("kind"))
    duplicate = flagged.where("duplicate").select(*MESSAGE_KEYS, F.lit("duplicate").alias("kind"))
    missing = lost(flagged, grace_ms).select(*MESSAGE_KEYS, F.lit("lost").alias("kind"))
    return early.unionByName(duplicate).unionByName(missing)


def lateness_histogram(flagged: DataFrame, low: int, width: int, bins: int) -> DataFrame:
    """Claims per lateness bin: (keys, bin, count); the end bins hold everything beyond.

    One range for every group, so callers pass one topic's `events` with that topic's range.
    """
    from pyspark.sql import functions as F

    index = F.floor((F.col("lateness") - low) / width).cast("int")
    clipped = F.least(F.greatest(index, F.lit(0)), F.lit(bins - 1))
    claims = flagged.where(F.col("event") == "claimed")
    return claims.groupBy(*TOPIC_KEYS, clipped.alias("bin")).count()


def timeline(flagged: DataFrame, bucket_ms: int) -> DataFrame:
    """Claims per time bucket by due time and by delivery time: (keys, bucket, due, delivered).

    On time, the two series coincide; lateness shows as `delivered` trailing `due`.
    """
    from pyspark.sql import functions as F

    claims = flagged.where(F.col("event") == "claimed")
    due = claims.groupBy(*TOPIC_KEYS, F.floor(F.col("due") / bucket_ms).alias("bucket")).agg(
        F.count("*").alias("due")
    )
    delivered = claims.groupBy(*TOPIC_KEYS, F.floor(F.col("t") / bucket_ms).alias("bucket")).agg(
        F.count("*").alias("delivered")
    )
    return (
        due.join(delivered, [*TOPIC_KEYS, "bucket"], "full")
        .na.fill(0, ["due", "delivered"])
        .orderBy(*TOPIC_KEYS, "bucket")
    )
