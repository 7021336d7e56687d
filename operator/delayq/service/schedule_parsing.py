"""Schedule bodies of the HTTP API → `Schedule`, and back to JSON (pure).

The fields are the engine's in camelCase (`everyMs`, `timeZone`, `catchUpMax`). Every bound is
checked here with the field named; what only the engine can judge (a cron expression, a time
zone, the window's order) is refused by `Recurrence` and reported under the field it names.
"""

from __future__ import annotations

from typing import Any

from delayq.queue.codes import InvalidMessageError
from delayq.queue.recurrence import MAX_CATCH_UP, MAX_INSTANT_MS, CatchUp, Recurrence
from delayq.queue.schedules import DEFAULT_CATCH_UP_MAX, Schedule, ScheduleInfo
from delayq.queue.topic import Topic
from delayq.service.envelope import encode_payload
from delayq.service.parsing import (
    Body,
    FieldError,
    check_id,
    get_int,
    get_str,
    parse_group,
    parse_headers,
    parse_payload,
    parse_priority,
)

MAX_CRON_CHARS = 200
#: the engine's words for the fields `Recurrence` checks itself -> the HTTP field
_ENGINE_FIELDS = {
    "cron": "cron",
    "time_zone": "timeZone",
    "every_ms": "everyMs",
    "start_ms": "startMs",
    "end_ms": "endMs",
    "schedule id": "id",
}
_KNOWN = {
    "cron",
    "timeZone",
    "everyMs",
    "startMs",
    "endMs",
    "catchUp",
    "catchUpMax",
    "payload",
    "encoding",
    "headers",
    "priority",
    "group",
}


def parse_schedule(schedule_id: str, body: Body, topic: Topic) -> Schedule:
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise FieldError(
            unknown[0], f"{unknown[0]} is not a schedule field (known: {sorted(_KNOWN)})"
        )
    has_cron, has_every = body.get("cron") is not None, body.get("everyMs") is not None
    if has_cron == has_every:
        raise FieldError("cron", "give exactly one of cron (with timeZone) or everyMs")
    cron = get_str(body, "cron") if has_cron else None
    if cron is not None and len(cron) > MAX_CRON_CHARS:
        raise FieldError("cron", f"cron must be at most {MAX_CRON_CHARS} characters")
    window = {
        name: get_int(body, name, 0, MAX_INSTANT_MS) if body.get(name) is not None else None
        for name in ("startMs", "endMs")
    }
    catch_up_text = get_str(body, "catchUp", CatchUp.ONCE.value)
    try:
        catch_up = CatchUp(catch_up_text)
    except ValueError:
        raise FieldError(
            "catchUp", f"catchUp must be one of {[c.value for c in CatchUp]}"
        ) from None
    try:
        recurrence = Recurrence(
            cron=cron,
            time_zone=get_str(body, "timeZone", "UTC"),
            every_ms=get_int(body, "everyMs", 1, MAX_INSTANT_MS) if has_every else None,
            start_ms=window["startMs"],
            end_ms=window["endMs"],
        )
    except InvalidMessageError as error:
        raise as_field_error(error) from None
    try:
        return Schedule(
            check_id(schedule_id, "id"),
            recurrence,
            parse_payload(body, topic),
            parse_headers(body),
            catch_up,
            get_int(body, "catchUpMax", 1, MAX_CATCH_UP, DEFAULT_CATCH_UP_MAX),
            parse_priority(body),
            parse_group(body),
        )
    except InvalidMessageError as error:
        raise as_field_error(error) from None


def as_field_error(error: InvalidMessageError) -> FieldError:
    """The engine's refusal of a schedule under the HTTP field it names (its first engine word:
    "end_ms 9 is before start_ms 10" is about endMs), in the API's words ("endMs 9 is before
    startMs 10")."""
    text = str(error)
    named = [(text.find(word), field) for word, field in _ENGINE_FIELDS.items() if word in text]
    for word, field in _ENGINE_FIELDS.items():
        if "_" in word:
            text = text.replace(word, field)
    return FieldError(min(named)[1] if named else "body", text)


def schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    schedule, recurrence = info.schedule, info.schedule.recurrence
    raw = schedule.payload.encode() if isinstance(schedule.payload, str) else schedule.payload
    payload, encoding = encode_payload(raw)
    body: dict[str, Any] = {
        "id": schedule.id,
        "slot": info.slot,
        "catchUp": schedule.catch_up.value,
        "catchUpMax": schedule.catch_up_max,
        "payload": payload,
        "encoding": encoding,
        "headers": schedule.headers,
        "priority": schedule.priority,
        "currentId": info.current_id,
        "currentDueMs": info.current_due_ms,
        "waiting": info.waiting,
        "nextDueMs": info.next_due_ms,
        "ended": info.ended,
    }
    if recurrence.cron is not None:
        body.update(cron=recurrence.cron, timeZone=recurrence.time_zone)
    else:
        body["everyMs"] = recurrence.every_ms
    optional = {"startMs": recurrence.start_ms, "endMs": recurrence.end_ms, "group": schedule.group}
    body.update({key: value for key, value in optional.items() if value is not None})
    return body
