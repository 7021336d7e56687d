"""The ingest's pure transforms on a real local Spark: routing and validation match the engine."""

from __future__ import annotations

import json
import random
import string
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq.pipeline import transforms as T
from delayq.queue import produce_plans
from delayq.queue.codes import InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, Topic, slot_of
from delayq.queue.trace_context import trace_context_error

SLOT_AMOUNTS = (1, 2, 16, 1024, 16384)
NOW_MS = 1_800_000_000_000
LIMIT = 64


def _random_ids(count: int) -> list[str]:
    rng = random.Random(6)
    alphabet = string.ascii_letters + string.digits + "-_:/.éüß中文🙂 "
    return [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(count)
    ] + ["", "a", "order-1", "\u0000", "x" * 300]


def _spark_slots(spark, bases: list[str]) -> list[dict[int, int]]:
    df = spark.createDataFrame([(b,) for b in bases], "basis string")
    from pyspark.sql import functions as F

    columns = [T.slot_column(F.col("basis"), n).alias(f"s{n}") for n in SLOT_AMOUNTS]
    return [{n: row[f"s{n}"] for n in SLOT_AMOUNTS} for row in df.select(*columns).collect()]


def test_slot_column_equals_engine_routing_on_fixed_ids(spark):
    bases = _random_ids(3000)
    for basis, slots in zip(bases, _spark_slots(spark, bases), strict=True):
        assert slots == {n: slot_of(basis, n) for n in SLOT_AMOUNTS}, basis


@settings(max_examples=8, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=30), min_size=1, max_size=100))
def test_slot_column_equals_engine_routing_on_any_text(spark, bases):
    for basis, slots in zip(bases, _spark_slots(spark, bases), strict=True):
        assert slots == {n: slot_of(basis, n) for n in SLOT_AMOUNTS}, basis


def test_slot_column_refuses_a_slot_amount_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        T.slot_column(None, 12)


ROW_SCHEMA = "id string, payload string, due_at long, delay long"


def _engine_accepts(message_id, payload, due_at, delay) -> bool:
    topic = Topic("t", max_payload_bytes=LIMIT)
    request = ScheduleRequest(message_id or "", payload or b"", delay_ms=delay, at_ms=due_at)
    try:
        produce_plans.schedule(topic, [request], Mode.CREATE)
    except InvalidMessageError:
        return False
    return True


def test_validation_agrees_with_the_engine(spark):
    rows = [
        ("ok-delay", "p", None, 1000),
        ("ok-due", "p", NOW_MS, None),
        ("ok-empty-payload", None, None, 0),
        (None, "p", None, 1),
        ("", "p", None, 1),
        ("x" * MAX_ID_BYTES, "p", None, 1),
        ("x" * (MAX_ID_BYTES + 1), "p", None, 1),
        ("é" * (MAX_ID_BYTES // 2 + 1), "p", None, 1),
        ("both", "p", NOW_MS, 5),
        ("neither", "p", None, None),
        ("negative-delay", "p", None, -1),
        ("max-delay", "p", None, MAX_DELAY_MS),
        ("over-max-delay", "p", None, MAX_DELAY_MS + 1),
        ("negative-due", "p", -5, None),
        ("payload-at-limit", "x" * LIMIT, None, 1),
        ("payload-over-limit", "x" * (LIMIT + 1), None, 1),
        ("payload-multibyte-over", "é" * (LIMIT // 2 + 1), None, 1),
    ]
    df = spark.createDataFrame(rows, ROW_SCHEMA)
    validated = T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()
    for row, result in zip(rows, validated, strict=True):
        assert (result.reason is None) == _engine_accepts(*row), (row, result.reason)


def test_ids_and_slot_bases_the_engine_refuses_are_rejected_with_their_row(spark):
    """A control character in the id, an empty, overlong or control-character slot basis: the
    engine refuses them, so Spark must too, or the writer rejects them with only their id and
    times as the source (payload, headers and the basis itself gone from the rejects file)."""
    rows = [
        ("ok", "p", None, 1, "tenant-7"),
        ("ok-no-basis", "p", None, 1, None),
        ("bell\x07", "p", None, 1, None),
        ("c1\x85", "p", None, 1, None),
        ("empty-basis", "p", None, 1, ""),
        ("long-basis", "p", None, 1, "b" * (MAX_ID_BYTES + 1)),
        ("longest-basis", "p", None, 1, "b" * MAX_ID_BYTES),
        ("control-basis", "p", None, 1, "ten\nant"),
    ]
    df = spark.createDataFrame(rows, ROW_SCHEMA + ", slot_basis string")
    validated = T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()
    for row, result in zip(rows, validated, strict=True):
        topic = Topic("t", max_payload_bytes=LIMIT)
        request = ScheduleRequest(row[0], row[1], delay_ms=row[3], slot_basis=row[4])
        try:
            produce_plans.schedule(topic, [request], Mode.CREATE)
            accepted = True
        except InvalidMessageError:
            accepted = False
        assert (result.reason is None) == accepted, (row, result.reason)
    reasons = {r.id: r.reason for r in validated}
    assert reasons["empty-basis"].startswith("empty slot_basis")
    assert reasons["control-basis"] == "slot_basis contains a control character"
    assert reasons["c1\x85"] == "id contains a control character"
    assert reasons["long-basis"] == f"slot_basis longer than {MAX_ID_BYTES} bytes"


texts = st.text(alphabet=st.sampled_from("aé中🙂"), max_size=MAX_ID_BYTES // 2 + 8)
delays = st.one_of(st.none(), st.integers(-2, 2), st.integers(MAX_DELAY_MS - 2, MAX_DELAY_MS + 2))


@settings(max_examples=6, deadline=None)
@given(st.lists(st.tuples(texts, st.integers(LIMIT - 4, LIMIT + 4), delays, delays), max_size=40))
def test_validation_agrees_with_the_engine_on_generated_rows(spark, cases):
    rows = [(i or None, "é" * (n // 2) + "x" * (n % 2), due, d) for i, n, due, d in cases]
    if not rows:
        return
    validated = T.validate(T.canonical(spark.createDataFrame(rows, ROW_SCHEMA), {}), LIMIT, NOW_MS)
    for row, result in zip(rows, validated.collect(), strict=True):
        assert (result.reason is None) == _engine_accepts(*row), (row, result.reason)


def test_validation_reasons_on_text_input(spark):
    rows = [
        ("a", "2026-11-22T10:00:00Z", None, '{"k": "v", "n": 1}'),
        ("b", "2026-11-22 10:00:00", None, None),
        ("c", "2026-11-22T11:00:00+01:00", None, None),
        ("d", "1800000000000", None, None),
        ("e", "yesterday-ish", None, None),
        ("f", None, "soon", None),
        ("g", None, "250", "not json"),
        ("h", None, "250", "[1, 2]"),
        ("i", "2999-01-01T00:00:00Z", None, None),
    ]
    df = spark.createDataFrame(rows, "key string, when string, wait string, meta string")
    mapping = T.parse_mapping("id=key, due_at=when,delay=wait ,headers=meta")
    result = {r.id: r for r in T.validate(T.canonical(df, mapping), LIMIT, NOW_MS).collect()}
    ten = int(datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp() * 1000)
    assert [result[k].due_ms for k in "abcd"] == [ten, ten, ten, 1_800_000_000_000]
    assert result["a"].headers == {"k": "v", "n": "1"}
    assert all(result[k].reason is None for k in "abcd")
    assert result["e"].reason == "unparseable due_at"
    assert result["f"].reason == "unparseable delay"
    assert result["g"].reason == result["h"].reason == "headers not a JSON object"
    assert result["i"].reason.startswith("due_at beyond the maximum delay")
    assert result["e"].source == '{"key":"e","when":"yesterday-ish"}'


def test_a_priority_the_engine_refuses_is_rejected_with_its_row(spark):
    """Whole numbers 0 to 9 (text or a whole float too) pass as the engine's priority; a
    fraction, a number out of range, a bool or other text is rejected; none is 0."""
    cases = [
        ("int", "priority long", 7, 7),
        ("none", "priority long", None, 0),
        ("high", "priority long", 10, None),
        ("negative", "priority long", -1, None),
        ("text", "priority string", " 3 ", 3),
        ("word", "priority string", "high", None),
        ("whole", "priority double", 4.0, 4),
        ("fraction", "priority double", 1.5, None),
        ("bool", "priority boolean", True, None),
    ]
    for name, column, value, expected in cases:
        df = spark.createDataFrame([(name, 1, value)], f"id string, delay long, {column}")
        [row] = T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()
        if expected is None:
            assert row.reason == "priority not an integer from 0 to 9", (name, row)
        else:
            assert (row.reason, row.priority) == (None, expected), (name, row)
            request = ScheduleRequest(name, delay_ms=1, priority=row.priority)
            produce_plans.schedule(Topic("t"), [request], Mode.CREATE)  # the engine takes it


def test_a_group_the_engine_refuses_is_rejected_with_its_row(spark):
    """A group passes as the engine takes it (a number as its text); an empty one, one over
    128 bytes or with a control character is rejected as the engine would refuse it."""
    cases = [
        ("text", "group string", "tenant:42", "tenant:42", None),
        ("none", "group string", None, None, None),
        ("number", "group long", 42, "42", None),
        ("empty", "group string", "", None, "empty group (leave it out for none)"),
        ("long", "group string", "é" * 65, None, "group longer than 128 bytes"),
        ("control", "group string", "a\x00b", None, "group contains a control character"),
    ]
    for name, column, value, expected, reason in cases:
        df = spark.createDataFrame([(name, 1, value)], f"id string, delay long, {column}")
        [row] = T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()
        assert (row.reason, row.group) == (reason, expected if reason is None else row.group)
        request = ScheduleRequest(name, delay_ms=1, group=str(value) if reason else row.group)
        if reason is None:
            produce_plans.schedule(Topic("t"), [request], Mode.CREATE)  # the engine takes it
        else:
            with pytest.raises(InvalidMessageError, match=r"^group "):
                produce_plans.schedule(Topic("t"), [request], Mode.CREATE)


def test_fractional_times_are_whole_milliseconds(spark):
    rows = [("a", 1_800_000_000_000.7, None), ("b", None, 250.9), ("c", float("nan"), None)]
    df = spark.createDataFrame(rows, "id string, due_at double, delay double")
    result = {r.id: r for r in T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()}
    assert (result["a"].due_ms, result["b"].delay_ms) == (1_800_000_000_000, 250)
    assert result["c"].reason == "unparseable due_at"


def test_numeric_ids_and_payloads_are_their_text(spark):
    df = spark.createDataFrame(
        [(42, 7, 1000, 3)], "id long, payload int, delay long, slot_basis int"
    )
    [row] = T.good_rows(T.validate(T.canonical(df, {}), LIMIT, NOW_MS), 16).collect()
    assert (row.id, row.payload, row.slot) == ("42", "7", slot_of("3", 16))


def test_canonical_refuses_inputs_without_id_or_time(spark):
    df = spark.createDataFrame([("a", 1)], "key string, delay long")
    with pytest.raises(T.MappingError, match="no id column"):
        T.canonical(df, {})
    with pytest.raises(T.MappingError, match="neither"):
        T.canonical(df.withColumnRenamed("delay", "x"), {"id": "key"})
    with pytest.raises(T.MappingError, match="bad mapping"):
        T.parse_mapping("identifier=key")


def test_good_rows_carry_the_engine_slot_of_the_basis(spark):
    rows = [("m1", "p", None, 5, None), ("m2", "p", None, 5, "tenant-7")]
    df = spark.createDataFrame(rows, ROW_SCHEMA + ", slot_basis string")
    good = T.good_rows(T.validate(T.canonical(df, {}), LIMIT, NOW_MS), 64).collect()
    assert [(r.id, r.slot) for r in good] == [
        ("m1", slot_of("m1", 64)),
        ("m2", slot_of("tenant-7", 64)),
    ]


def test_headers_with_a_null_value_are_rejected_with_their_row(spark):
    """`{"k": null}` parses as a map with a null value, which the engine refuses (header values
    are strings): rejected here, with the row, not later by the writer without it."""
    rows = [("m1", "p", None, 5, '{"k": null}'), ("m2", "p", None, 5, '{"k": "v"}')]
    df = spark.createDataFrame(rows, ROW_SCHEMA + ", headers string")
    result = {r.id: r for r in T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()}
    assert result["m1"].reason == "headers not a JSON object of strings"
    assert json.loads(result["m1"].source)["headers"] == '{"k": null}'
    assert result["m2"].reason is None


def test_good_rows_carry_headers_as_json_object_text(spark):
    """The writer's headers column is text (see good_rows), null where a row has none."""
    rows = [("m1", "p", None, 5, '{"k": "v", "n": 1}'), ("m2", "p", None, 5, None)]
    df = spark.createDataFrame(rows, ROW_SCHEMA + ", headers string")
    good = T.good_rows(T.validate(T.canonical(df, {}), LIMIT, NOW_MS), 16).collect()
    assert [r.headers for r in good] == ['{"k":"v","n":"1"}', None]


def test_a_malformed_trace_context_is_rejected_with_its_row(spark):
    """The engine's W3C checks, in Spark (Java's regex, the same patterns)."""
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    cases = {
        "ok": {"traceparent": good, "tracestate": "shop=1, rojo=00f0@x"},
        "upper": {"traceparent": good.upper()},
        "zero": {"traceparent": good.replace("00f067aa0ba902b7", "0" * 16)},
        "alone": {"tracestate": "shop=1"},
        "state": {"traceparent": good, "tracestate": "Shop=1"},
    }
    rows = [(name, "p", None, 5, json.dumps(headers)) for name, headers in cases.items()]
    df = spark.createDataFrame(rows, ROW_SCHEMA + ", headers string")
    result = {r.id: r.reason for r in T.validate(T.canonical(df, {}), LIMIT, NOW_MS).collect()}
    assert result == {
        "ok": None,
        "upper": "headers.traceparent not a W3C traceparent",
        "zero": "headers.traceparent not a W3C traceparent",
        "alone": "headers.tracestate alone",
        "state": "headers.tracestate not a W3C tracestate",
    }
    for name, headers in cases.items():  # the engine agrees
        assert (trace_context_error(headers) is None) == (result[name] is None), name
