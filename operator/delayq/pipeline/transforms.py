"""Pure DataFrame transforms of the bulk ingest: column mapping, validation, slot routing.

Every rule here is a Spark column expression (no Python UDF), so validating a million rows costs
the JVM a scan and nothing crosses into Python until the writer. The bounds come from the
engine (`delayq.queue.topic`), and `tests/pipeline/test_transforms.py` checks that a row passes
here exactly when the engine's own validation (`delayq.queue.codec`) accepts it and that the
slot column equals `delayq.queue.topic.slot_of`, so the two can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.queue.codec import MAX_GROUP_BYTES, MAX_PRIORITY
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, is_power_of_two
from delayq.queue.trace_context import (
    MAX_TRACESTATE_BYTES,
    TRACEPARENT,
    TRACEPARENT_PATTERN,
    TRACESTATE,
    TRACESTATE_PATTERN,
)

# The input columns the ingest understands, after the optional --map renaming.
ID, PAYLOAD, DUE_AT, DELAY, SLOT_BASIS, HEADERS, PRIORITY, GROUP = (
    "id",
    "payload",
    "due_at",
    "delay",
    "slot_basis",
    "headers",
    "priority",
    "group",
)
CANONICAL = (ID, PAYLOAD, DUE_AT, DELAY, SLOT_BASIS, HEADERS, PRIORITY, GROUP)

# Columns a reader adds for a line it could not take as a row (`ingest.read_input`): a CSV
# line's fields beyond its header's (Spark's PERMISSIVE mode would drop them), and Spark's own
# column of a JSON line that does not parse.
EXTRA_FIELDS = "_delayq_extra_fields"
CORRUPT_RECORD = "_corrupt_record"
MALFORMED = {
    EXTRA_FIELDS: "more fields than the header line",
    CORRUPT_RECORD: "not a JSON object",
}

# Columns the validation adds.
REASON = "reason"  # null on a good row, else why it was rejected
SOURCE = "source"  # the original row as JSON, kept for the rejects file
LINE = "line"  # why the reader could not take the line as a row (MALFORMED), else null
DUE_MS = "due_ms"  # absolute due time in ms since the epoch (null when a delay is given)
DELAY_MS = "delay_ms"  # delay from the Redis server's now (null when due_at is given)
SLOT = "slot"

# The columns the Redis writer receives, in this order (headers as JSON object text).
GOOD_COLUMNS = (ID, PAYLOAD, DUE_MS, DELAY_MS, SLOT_BASIS, HEADERS, SLOT, PRIORITY, GROUP)

Column = Any  # pyspark.sql.Column; pyspark ships no type information mypy can use
DataFrame = Any  # pyspark.sql.DataFrame


class MappingError(ValueError):
    """The input does not have the columns the ingest needs (a configuration error)."""


def parse_mapping(text: str | None) -> dict[str, str]:
    """`id=order_id,payload=body` -> {"id": "order_id", "payload": "body"}."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, source = item.partition("=")
        name, source = name.strip(), source.strip()
        if not sep or name not in CANONICAL or not source:
            names = ", ".join(CANONICAL)
            raise MappingError(f"bad mapping {item!r}: expected NAME=COLUMN, NAME one of {names}")
        mapping[name] = source
    return mapping


def canonical(df: DataFrame, mapping: Mapping[str, str]) -> DataFrame:
    """The canonical columns (renamed by `mapping`, null when absent) plus the source row and
    why its line is malformed (`LINE`: a reader's column of MALFORMED set on it).

    A missing id column or a file with neither due_at nor delay is a configuration error, raised
    at once instead of rejecting every row.
    """
    from pyspark.sql import functions as F

    present = {name: mapping.get(name, name) for name in CANONICAL}
    present = {name: source for name, source in present.items() if source in df.columns}
    if ID not in present:
        raise MappingError(f"no id column {mapping.get(ID, ID)!r} in {df.columns}")
    if DUE_AT not in present and DELAY not in present:
        raise MappingError(f"neither a due_at nor a delay column in {df.columns}")

    def column(name: str) -> Column:
        if name not in present:
            return F.lit(None).alias(name)
        value = F.col(f"`{present[name]}`")
        kind = df.schema[present[name]].dataType.typeName()
        if name in (ID, SLOT_BASIS, GROUP) or (name == PAYLOAD and kind != "binary"):
            value = value.cast("string")  # a numeric id or payload means its decimal text
        return value.alias(name)

    columns = [column(name) for name in CANONICAL]
    source = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).alias(SOURCE)
    line = F.lit(None).cast("string")
    for name, why in MALFORMED.items():
        if name in df.columns:
            line = F.when(F.col(name).isNotNull(), F.lit(why)).otherwise(line)
    return df.select(*columns, source, line.alias(LINE))


def _type_name(df: DataFrame, column: str) -> str:
    return str(df.schema[column].dataType.typeName())


def _as_ms(df: DataFrame, column: str, timestamps: bool) -> Column:
    """Milliseconds as a long, or null when unparseable (never an error: ANSI mode is on).

    Numbers are ms already (fractions dropped); text is an integer or (for due_at) an ISO-8601
    timestamp, read in the session time zone (UTC) unless it carries an offset.
    """
    from pyspark.sql import functions as F

    kind = _type_name(df, column)
    value = F.col(column)
    if kind in ("timestamp", "timestamp_ntz"):
        return F.unix_millis(value.cast("timestamp"))
    if kind in ("byte", "short", "integer", "long", "void"):
        return value.cast("long")
    if kind in ("float", "double") or kind.startswith("decimal"):
        return F.when(~F.isnan(value.cast("double")), F.floor(value).try_cast("long"))
    text = F.trim(value.cast("string"))
    as_long = text.try_cast("long")
    if not timestamps:
        return as_long
    return F.when(text.rlike(r"^-?[0-9]+$"), as_long).otherwise(
        F.unix_millis(F.try_to_timestamp(text))
    )


def _priority(df: DataFrame) -> Column:
    """The priority as a long, or null when it is not a whole number (a bool, a fraction,
    text other than digits): the engine takes integers only. A whole float (3.0, as a
    column with gaps reads from JSON or pandas) is the integer it holds."""
    from pyspark.sql import functions as F

    kind = _type_name(df, PRIORITY)
    value = F.col(PRIORITY)
    if kind in ("byte", "short", "integer", "long", "void"):
        return value.cast("long")
    if kind in ("float", "double") or kind.startswith("decimal"):
        number = value.cast("double")
        return F.when(~F.isnan(number) & (number == F.floor(number)), value.try_cast("long"))
    if kind == "string":
        text = F.trim(value)
        return F.when(text.rlike(r"^[0-9]{1,2}$"), text.cast("long"))
    return F.lit(None).cast("long")


def _headers_map(df: DataFrame) -> Column:
    """Headers as map<string,string>: JSON object text, or a nested object / map as read."""
    from pyspark.sql import functions as F

    kind = _type_name(df, HEADERS)
    value = F.col(HEADERS)
    if kind == "void":
        return F.lit(None).cast("map<string,string>")
    text = value if kind == "string" else F.to_json(value)
    return F.from_json(text, "map<string,string>")


# The engine's id rule (`delayq.queue.codec.CONTROL_CHARACTERS`) as a Java regex: C0, DEL, C1.
CONTROL_CHARACTER = "[\\x00-\\x1f\\x7f-\\x9f]"


def _id_rules(name: str, max_bytes: int = MAX_ID_BYTES) -> list[tuple[Column, Column]]:
    """The engine's rule for an id, a slot basis (`codec.encode_id`) and a group
    (`codec.encode_group`, MAX_GROUP_BYTES) beyond presence: at most `max_bytes` of UTF-8, no
    control character. Checked here so that such a row is rejected with its whole source row,
    not later by the writer with only its id and times."""
    from pyspark.sql import functions as F

    value = F.col(name)
    return [
        (F.octet_length(value) > max_bytes, F.lit(f"{name} longer than {max_bytes} bytes")),
        (value.rlike(CONTROL_CHARACTER), F.lit(f"{name} contains a control character")),
    ]


def _trace_context_rules(headers: Column) -> list[tuple[Column, Column]]:
    """The engine's check of a row's W3C trace context headers (`queue/trace_context.py`),
    so that a malformed one is rejected with its row rather than refused by the writer."""
    from pyspark.sql import functions as F

    traceparent, tracestate = headers.getItem(TRACEPARENT), headers.getItem(TRACESTATE)
    return [
        (
            ~traceparent.rlike(f"^{TRACEPARENT_PATTERN}$"),
            F.lit("headers.traceparent not a W3C traceparent"),
        ),
        (tracestate.isNotNull() & traceparent.isNull(), F.lit("headers.tracestate alone")),
        (
            (F.length(tracestate) > MAX_TRACESTATE_BYTES)
            | ((tracestate != "") & ~tracestate.rlike(f"^{TRACESTATE_PATTERN}$")),
            F.lit("headers.tracestate not a W3C tracestate"),
        ),
    ]


def validate(df: DataFrame, max_payload_bytes: int, now_ms: int) -> DataFrame:
    """Add `reason` (null = good), `due_ms`, `delay_ms` and normalised `headers`.

    `now_ms` is the client's clock, used only to reject due_at beyond the maximum delay early;
    the engine checks again against the Redis server's clock and the writer reports what it
    refuses (TOO_FAR) as a reject too.
    """
    from pyspark.sql import functions as F

    due_ms, delay_ms, headers = _as_ms(df, DUE_AT, True), _as_ms(df, DELAY, False), _headers_map(df)
    priority = _priority(df)
    payload_bytes = F.octet_length(F.col(PAYLOAD))
    has_due, has_delay = F.col(DUE_AT).isNotNull(), F.col(DELAY).isNotNull()
    rules = [
        (F.col(LINE).isNotNull(), F.col(LINE)),
        (F.col(ID).isNull() | (F.octet_length(F.col(ID)) == 0), F.lit("missing id")),
        *_id_rules(ID),
        (F.col(SLOT_BASIS) == "", F.lit("empty slot_basis (leave it out to route by the id)")),
        *_id_rules(SLOT_BASIS),
        (has_due & has_delay, F.lit("both due_at and delay given")),
        (~has_due & ~has_delay, F.lit("neither due_at nor delay given")),
        (has_due & due_ms.isNull(), F.lit("unparseable due_at")),
        (has_delay & delay_ms.isNull(), F.lit("unparseable delay")),
        (delay_ms < 0, F.lit("negative delay")),
        (delay_ms > MAX_DELAY_MS, F.lit(f"delay beyond the maximum of {MAX_DELAY_MS} ms")),
        (due_ms < 0, F.lit("due_at before the epoch")),
        (
            due_ms > now_ms + MAX_DELAY_MS,
            F.lit(f"due_at beyond the maximum delay of {MAX_DELAY_MS} ms"),
        ),
        (
            payload_bytes > max_payload_bytes,
            F.format_string(
                f"payload of %d bytes over the limit of {max_payload_bytes} bytes", payload_bytes
            ),
        ),
        (F.col(HEADERS).isNotNull() & headers.isNull(), F.lit("headers not a JSON object")),
        (  # {"k": null}: a map with a null value, where the engine takes only strings
            F.exists(F.map_values(headers), lambda value: value.isNull()),
            F.lit("headers not a JSON object of strings"),
        ),
        *_trace_context_rules(headers),
        (
            F.col(PRIORITY).isNotNull()
            & (priority.isNull() | (priority < 0) | (priority > MAX_PRIORITY)),
            F.lit(f"priority not an integer from 0 to {MAX_PRIORITY}"),
        ),
        (F.col(GROUP) == "", F.lit("empty group (leave it out for none)")),
        *_id_rules(GROUP, MAX_GROUP_BYTES),
    ]
    reason = F.lit(None).cast("string")
    for failed, text in reversed(rules):  # the first failing rule names the reason
        reason = F.when(failed, text).otherwise(reason)
    return df.select(
        ID,
        PAYLOAD,
        F.when(has_due, due_ms).alias(DUE_MS),
        F.when(has_delay, delay_ms).alias(DELAY_MS),
        SLOT_BASIS,
        headers.alias(HEADERS),
        F.coalesce(priority, F.lit(0)).alias(PRIORITY),
        GROUP,
        SOURCE,
        reason.alias(REASON),
    )


def slot_column(basis: Column, slot_amount: int) -> Column:
    """CRC32 of the basis's UTF-8 bytes masked by slotAmount-1: `delayq.queue.topic.slot_of`.

    Spark's crc32 is java.util.zip.CRC32 (IEEE, as zlib's) and a string cast to binary is its
    UTF-8 encoding, so this is the engine's routing evaluated inside the JVM.
    """
    from pyspark.sql import functions as F

    if not is_power_of_two(slot_amount):
        raise ValueError(f"slot amount {slot_amount} must be a power of two")
    return F.crc32(basis.cast("binary")).bitwiseAND(F.lit(slot_amount - 1)).cast("int")


def good_rows(validated: DataFrame, slot_amount: int) -> DataFrame:
    """Valid rows with their slot (routed by slot_basis, else the id), writer columns only.

    Headers travel to the writer as JSON object text, not as a map: the JVM's Arrow writer
    spends about 8 µs on every row of a map column, even a null one (1M rows: 8 s of CPU, more
    than the rest of the transfer), where a null text costs nothing.
    """
    from pyspark.sql import functions as F

    basis = F.coalesce(F.col(SLOT_BASIS), F.col(ID))
    routed = validated.where(F.col(REASON).isNull()).withColumn(
        SLOT, slot_column(basis, slot_amount)
    )
    return routed.select(
        *(F.to_json(name).alias(name) if name == HEADERS else name for name in GOOD_COLUMNS)
    )


def rejected_rows(validated: DataFrame) -> DataFrame:
    """Invalid rows as (id, reason, source): the shape of the rejects file."""
    from pyspark.sql import functions as F

    return validated.where(F.col(REASON).isNotNull()).select(ID, REASON, SOURCE)


def by_slot(good: DataFrame, partitions: int) -> DataFrame:
    """All rows of a slot in one partition, sorted by slot: one writer per slot, few calls."""
    from pyspark.sql import functions as F

    return good.repartition(partitions, F.col(SLOT)).sortWithinPartitions(SLOT)
