"""Recurring schedule routes: put (create or replace), get, delete, list."""

from __future__ import annotations

from aiohttp import web

from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.model import Target
from delayq.queue.schedules import ScheduleInfo
from delayq.service.http_support import json_body, service_for
from delayq.service.parsing import check_id, check_text
from delayq.service.schedule_parsing import as_field_error, parse_schedule, schedule_json

SCHEDULES = "/v1/topics/{topic}/schedules"
SCHEDULE = SCHEDULES + "/{id:[^/]+}"  # any id, as for messages (a "/" travels as %2F)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(SCHEDULES, list_schedules)
    router.add_put(SCHEDULE, put_schedule)
    router.add_get(SCHEDULE, get_schedule)
    router.add_delete(SCHEDULE, delete_schedule)


def _schedule_id(request: web.Request) -> str:
    return check_id(check_text(request.match_info["id"], "id"), "id")


async def put_schedule(request: web.Request) -> web.Response:
    """201 when created, 200 when it replaced a schedule of that id; the answer is the stored
    schedule with its first occurrence."""
    service = service_for(request)
    schedule = parse_schedule(_schedule_id(request), await json_body(request), service.topic)
    queue, _ = service.brokers.place(schedule.target())
    try:
        result = await queue.put_schedule(schedule)
    except InvalidMessageError as error:  # no occurrence after now, or the first too far
        raise as_field_error(error) from None
    info = await queue.get_schedule(schedule.id)
    return web.json_response(
        schedule_json(info), status=201 if result.code is Code.CREATED else 200
    )


async def get_schedule(request: web.Request) -> web.Response:
    service = service_for(request)
    schedule_id = _schedule_id(request)
    queue, _ = service.brokers.place(Target(schedule_id))
    return web.json_response(schedule_json(await queue.get_schedule(schedule_id)))


async def delete_schedule(request: web.Request) -> web.Response:
    service = service_for(request)
    schedule_id = _schedule_id(request)
    queue, _ = service.brokers.place(Target(schedule_id))
    outcome = await queue.delete_schedule(schedule_id)
    return web.json_response({"id": outcome.id, "result": outcome.code.name.lower()})


async def list_schedules(request: web.Request) -> web.Response:
    """Every schedule of the topic, by slot (one round trip per broker)."""
    service = service_for(request)
    found: list[ScheduleInfo] = []
    for broker, slots in service.brokers.split(service.topic.slots).items():
        found += await service.brokers.queues[broker].list_schedules(slots)
    found.sort(key=lambda info: (info.slot, info.schedule.id))
    return web.json_response({"schedules": [schedule_json(info) for info in found]})
