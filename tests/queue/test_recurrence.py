"""When recurring schedules fire: every N, cron across DST changes, catch-up (pure)."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from delayq.queue import CatchUp, InvalidMessageError, Recurrence, Schedule, Topic
from delayq.queue.recurrence import following_due_ms
from delayq.queue.schedules import PENDING, decode_schedule, encode_schedule

BERLIN = ZoneInfo("Europe/Berlin")


def ms(*fields: int, zone: ZoneInfo = BERLIN, fold: int = 0) -> int:
    return int(datetime(*fields, tzinfo=zone, fold=fold).timestamp() * 1000)  # type: ignore[arg-type,misc]


def local(instant_ms: int) -> str:
    return datetime.fromtimestamp(instant_ms / 1000, BERLIN).strftime("%m-%d %H:%M %Z")


def series(recurrence: Recurrence, after_ms: int, count: int) -> list[int]:
    out: list[int] = []
    due: int | None = after_ms
    while len(out) < count and due is not None:
        due = recurrence.next_after(due)
        if due is not None:
            out.append(due)
    return out


def test_every_n_counts_from_its_start_and_stops_at_its_end() -> None:
    every = Recurrence(every_ms=1000, start_ms=10_000, end_ms=13_000)
    assert series(every, 0, 10) == [10_000, 11_000, 12_000, 13_000]
    assert every.next_after(11_500) == 12_000
    assert every.next_after(12_000) == 13_000  # strictly after
    assert every.next_after(13_000) is None


def test_an_every_n_series_without_start_is_anchored_one_period_after_definition() -> None:
    anchored = Recurrence(every_ms=500).anchored(now_ms=1_000)
    assert anchored.start_ms == 1_500
    assert anchored.anchored(now_ms=9_999) == anchored  # stored anchors never move


def test_cron_daily_across_spring_forward_fires_once_right_after_the_gap() -> None:
    # 2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist that night
    daily = Recurrence(cron="30 2 * * *", time_zone="Europe/Berlin")
    fired = [local(t) for t in series(daily, ms(2026, 3, 27, 12, 0), 4)]
    assert fired == [
        "03-28 02:30 CET",
        "03-29 03:00 CEST",  # the skipped local time fires at the first instant after the gap
        "03-30 02:30 CEST",
        "03-31 02:30 CEST",
    ]


def test_cron_daily_across_fall_back_fires_the_repeated_hour_once() -> None:
    # 2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice on the wall clock
    daily = Recurrence(cron="30 2 * * *", time_zone="Europe/Berlin")
    fired = series(daily, ms(2026, 10, 24, 12, 0), 3)
    assert [local(t) for t in fired] == ["10-25 02:30 CEST", "10-26 02:30 CET", "10-27 02:30 CET"]
    assert fired[1] - fired[0] == 25 * 3600 * 1000  # that day has 25 hours


def test_cron_every_half_hour_follows_real_time_through_both_changes() -> None:
    half_hourly = Recurrence(cron="*/30 * * * *", time_zone="Europe/Berlin")
    spring = series(half_hourly, ms(2026, 3, 29, 1, 0), 4)
    assert [local(t) for t in spring] == [
        "03-29 01:30 CET",
        "03-29 03:00 CEST",  # 02:00 and 02:30 never happen: nothing fires for them
        "03-29 03:30 CEST",
        "03-29 04:00 CEST",
    ]
    autumn = series(half_hourly, ms(2026, 10, 25, 1, 30), 5)
    # the wall clock shows 02:00 and 02:30 twice: a wildcard hour fires on both passes, and
    # every instant is 30 real minutes after the previous one (none skipped, none doubled)
    assert [local(t) for t in autumn] == [
        "10-25 02:00 CEST",
        "10-25 02:30 CEST",
        "10-25 02:00 CET",
        "10-25 02:30 CET",
        "10-25 03:00 CET",
    ]
    assert {b - a for a, b in itertools.pairwise(autumn)} == {30 * 60 * 1000}


def test_cron_with_seconds_and_a_window() -> None:
    start = ms(2026, 1, 1, 12, 0, zone=ZoneInfo("UTC"))
    cron = Recurrence(cron="*/20 * * * * *", start_ms=start, end_ms=start + 60_000)
    assert series(cron, 0, 10) == [start + k * 20_000 for k in range(4)]


def test_last_at_or_before_counts_back() -> None:
    every = Recurrence(every_ms=100, start_ms=1_000)
    assert every.last_at_or_before(1_950, 3) == 1_700
    assert every.last_at_or_before(1_150, 3) is None  # only two since the start
    hourly = Recurrence(cron="0 * * * *", time_zone="Europe/Berlin")
    assert hourly.last_at_or_before(ms(2026, 5, 1, 10, 0), 3) == ms(2026, 5, 1, 8, 0)


EVERY = Recurrence(every_ms=100, start_ms=1_000)


@pytest.mark.parametrize(
    ("catch_up", "waiting", "expected"),
    [
        # the successor is overdue and the current occurrence still waits: the claim decides
        (CatchUp.ONCE, True, 1_100),
        (CatchUp.SKIP, True, 1_100),
        # the current one was delivered (once) or skipped: resume after now
        (CatchUp.ONCE, False, 2_000),
        (CatchUp.SKIP, False, 2_000),
        # all: the latest 3 missed occurrences at most
        (CatchUp.ALL, True, 1_700),
        (CatchUp.ALL, False, 1_700),
    ],
)
def test_following_after_a_downtime(catch_up: CatchUp, waiting: bool, expected: int) -> None:
    assert following_due_ms(EVERY, 1_000, 1_950, catch_up, 3, waiting) == expected


def test_following_in_time_is_the_successor_and_none_at_the_end() -> None:
    assert following_due_ms(EVERY, 1_000, 1_050, CatchUp.SKIP, 3, waiting=False) == 1_100
    ended = Recurrence(every_ms=100, start_ms=1_000, end_ms=1_000)
    assert following_due_ms(ended, 1_000, 1_950, CatchUp.ALL, 3, waiting=False) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of cron or every_ms"),
        ({"cron": "* * * * *", "every_ms": 5}, "exactly one of cron or every_ms"),
        ({"every_ms": 0}, "every_ms 0 must be an integer"),
        ({"cron": "61 * * * *"}, "cron '61 \\* \\* \\* \\*': Bad minute"),
        ({"cron": "* * * * *", "time_zone": "Mars/Olympus"}, "not an IANA time zone"),
        ({"every_ms": 5, "start_ms": 10, "end_ms": 9}, "end_ms 9 is before start_ms 10"),
        ({"every_ms": 5, "start_ms": -1}, "start_ms -1 must be an integer"),
    ],
)
def test_a_bad_recurrence_is_refused_naming_the_field(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidMessageError, match=message):
        Recurrence(**kwargs)  # type: ignore[arg-type]


def test_a_schedule_id_leaves_room_for_the_occurrence_suffix() -> None:
    with pytest.raises(InvalidMessageError, match="longer than 239 bytes"):
        Schedule("x" * 240, EVERY)
    with pytest.raises(InvalidMessageError, match="catch_up_max 0"):
        Schedule("s", EVERY, catch_up_max=0)


def test_the_packed_schedule_round_trips() -> None:
    schedule = Schedule(
        "report:daily",
        Recurrence(cron="0 9 * * 1-5", time_zone="Europe/Berlin", end_ms=2**40),
        payload=b"\x00binary:payload",
        headers={"kind": "report"},
        catch_up=CatchUp.SKIP,
        catch_up_max=7,
    )
    raw = encode_schedule(Topic("t"), schedule, 123, PENDING)
    assert raw.startswith(b"123::skip:")
    info = decode_schedule(schedule.id, 3, raw, waiting=True)
    assert info.schedule == schedule
    assert (info.current_due_ms, info.next_due_ms, info.ended) == (123, None, False)
