"""Record packing and message validation (pure)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from delayq.queue import produce_plans
from delayq.queue.codec import (
    Record,
    decode_record,
    encode_headers,
    validate_id,
    validate_payload,
    when_argument,
)
from delayq.queue.codes import InvalidMessageError
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import MAX_DELAY_MS, MAX_ID_BYTES, Topic

TOPIC = Topic("orders", slot_amount=4)
TEN_YEARS_MS = 10 * 366 * 24 * 3600 * 1000


@given(
    st.integers(0, 10_000),
    st.one_of(st.none(), st.integers(0, 2**50)),
    st.one_of(st.none(), st.integers(1, 2**62)),
    st.one_of(st.none(), st.integers(0, 2**50)),
    st.one_of(st.none(), st.integers(0, 2**50)),
    st.dictionaries(st.text(), st.text(), max_size=4),
    st.binary(),
)
def test_record_round_trip(
    attempts: int,
    due: int | None,
    lease: int | None,
    expire: int | None,
    first: int | None,
    headers: dict[str, str],
    payload: bytes,
) -> None:
    """The layout of lua/includes/record_fields.lua, the optional tagged fields included (a
    record without them, as written before they existed, still reads). A lease (drawn from 1)
    is only held with the due it was for: a record with a lease and no due is 0.1.0's layout
    (test_release_0_1_0_records_read_with_no_lease)."""
    assume(lease is None or due is not None)
    header_bytes = encode_headers(headers)
    optional = ["" if value is None else str(value) for value in (due, lease)]
    extras = "".join(
        f"{tag}{value}:" for tag, value in (("x", expire), ("f", first)) if value is not None
    )
    raw = (
        f"{attempts}:{':'.join(optional)}:{extras}{len(header_bytes)}:".encode()
        + header_bytes
        + payload
    )
    record = decode_record(raw)
    assert record == Record(attempts, due, lease, headers, payload, expire, first)


@pytest.mark.parametrize(
    ("raw", "record"),
    [
        (b"0::0:p", Record(0, None, None, {}, b"p")),
        (b'0::9:{"k":"v"}p', Record(0, None, None, {"k": "v"}, b"p")),
        (b"1::0:7:3:x", Record(1, None, None, {}, b"7:3:x")),
        (b"1:500:0:5:p", Record(1, 500, None, {}, b"5:p")),
        (b'2:500:9:{"k":"v"}p', Record(2, 500, None, {"k": "v"}, b"p")),
    ],
)
def test_release_0_1_0_records_read_with_no_lease(raw: bytes, record: Record) -> None:
    """0.1.0 wrote `<attempts>:<due or empty>:<headers_len>:` (no lease field); a broker
    upgraded from it still holds such records (tests/queue/test_record_layout.py reads them
    through the scripts)."""
    assert decode_record(raw) == record


def test_ids_are_validated() -> None:
    assert validate_id("a") == "a"
    with pytest.raises(InvalidMessageError, match="non-empty"):
        validate_id("")
    with pytest.raises(InvalidMessageError, match=f"longer than {MAX_ID_BYTES} bytes"):
        validate_id("x" * (MAX_ID_BYTES + 1))


@pytest.mark.parametrize("bad", ["a\x00", "a\r\n", "\x1f", "a\x7f", "a\x80", "a\x9f", "\ud800"])
def test_ids_refuse_control_characters_and_lone_surrogates(bad: str) -> None:
    """Such ids were accepted, then could not be sent as a webhook header (dead after retries)."""
    with pytest.raises(InvalidMessageError, match=r"control character|lone surrogate"):
        validate_id(bad)
    with pytest.raises(InvalidMessageError, match="slot_basis"):
        produce_plans.schedule(
            TOPIC, [ScheduleRequest("a", delay_ms=1, slot_basis=bad)], Mode.CREATE
        )
    assert validate_id("é a\xa0{b}/%") == "é a\xa0{b}/%"  # printable non-ASCII, braces, spaces


def test_payload_limit_names_sizes() -> None:
    assert validate_payload("é", 2) == "é".encode()
    with pytest.raises(
        InvalidMessageError, match="payload of 3 bytes exceeds the topic limit of 2"
    ):
        validate_payload(b"abc", 2)


def test_headers_must_be_strings() -> None:
    with pytest.raises(InvalidMessageError, match="header"):
        encode_headers({"a": 1})  # type: ignore[dict-item]


def test_when_accepts_zero_to_beyond_ten_years() -> None:
    assert when_argument(0, None) == ("delay", 0)
    assert when_argument(TEN_YEARS_MS, None) == ("delay", TEN_YEARS_MS)
    assert when_argument(None, 1_700_000_000_000) == ("at", 1_700_000_000_000)


@pytest.mark.parametrize(
    ("delay_ms", "at_ms", "message"),
    [
        (None, None, "exactly one"),
        (1, 1, "exactly one"),
        (-1, None, "delay_ms -1"),
        (MAX_DELAY_MS + 1, None, "delay_ms"),
        (None, -5, "at_ms -5"),
        (1.5, None, "delay_ms 1.5"),
    ],
)
def test_when_rejects_bad_times(delay_ms: object, at_ms: object, message: str) -> None:
    with pytest.raises(InvalidMessageError, match=message):
        when_argument(delay_ms, at_ms)  # type: ignore[arg-type]


def test_an_expiry_stored_in_luas_exponent_form_still_reads() -> None:
    """Records written before the scripts formatted instants as integers: an expiry of 2**52
    was stored as Lua wrote it; it must still decode, or its slot's claims fail for good."""
    record = decode_record(b"0:::x4.5035996273705e+15:0:payload")
    assert record.expire_ms == 4_503_599_627_370_500
    assert record.payload == b"payload"


GOOD_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}, "traceparent"),
        ({"traceparent": GOOD_TRACEPARENT.upper()}, "traceparent"),
        ({"traceparent": "ff" + GOOD_TRACEPARENT[2:]}, "traceparent"),
        ({"traceparent": GOOD_TRACEPARENT.replace("00f067aa0ba902b7", "0" * 16)}, "traceparent"),
        ({"tracestate": "shop=1"}, "tracestate"),
        ({"traceparent": GOOD_TRACEPARENT, "tracestate": "shop=1,x" * 100}, "tracestate"),
        ({"traceparent": GOOD_TRACEPARENT, "tracestate": "Shop=1"}, "tracestate"),
    ],
)
def test_a_malformed_trace_context_header_is_refused_naming_it(headers, named) -> None:
    """The Python client's trace context is its message's `traceparent` (and `tracestate`)
    header: a malformed one is refused when scheduled, not handed to a receiver a wait later."""
    with pytest.raises(InvalidMessageError, match=f"header {named}:"):
        encode_headers(headers)


def test_a_hostile_tracestate_is_refused_at_once() -> None:
    """A tracestate is a producer's header (an HTTP one through the API): a backtracking
    pattern turned 100 bytes of empty members into minutes of one process's CPU, the GIL held
    (a whole pod stalled). Checked in a child process: a hang must fail the test, not stall it."""
    hostile = ["shop=1" + ",        " * 56 + "\x01", "shop=1" + ", \t" * 160 + "!"]
    check = (
        "import sys\n"
        "from delayq.queue.trace_context import trace_context_error\n"
        f"for state in {hostile!r}:\n"
        f"    assert trace_context_error({{'traceparent': {GOOD_TRACEPARENT!r},"
        " 'tracestate': state}) is not None\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=10)
