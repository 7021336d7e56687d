"""Producer routes: schedule (one, batch), get, cancel and reschedule messages by id."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from delayq.queue.client import AsyncQueue
from delayq.queue.codes import Code, NotFoundError, raise_for_code
from delayq.queue.model import Mode, ScheduleRequest, ScheduleResult, State
from delayq.queue.plans import Target
from delayq.service.envelope import info_json
from delayq.service.http_support import json_body, service_for, slot_of_target
from delayq.service.parsing import parse_batch, parse_message, parse_mode, parse_when
from delayq.service.service import DelayService

MESSAGES = "/v1/topics/{topic}/messages"
MESSAGE = MESSAGES + "/{id}"


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(MESSAGES, schedule)
    router.add_post(MESSAGES + "/batch", schedule_batch)
    router.add_get(MESSAGE, get)
    router.add_delete(MESSAGE, cancel)
    router.add_post(MESSAGE + "/reschedule", reschedule)


def result_json(result: ScheduleResult) -> dict[str, Any]:
    return {
        "id": result.id,
        "slot": result.slot,
        "result": result.code.name.lower(),
        "dueMs": result.due_ms,
        "state": result.state.value,
    }


async def schedule(request: web.Request) -> web.Response:
    """201 when created, 200 when it existed (create) or was replaced (upsert)."""
    service = service_for(request)
    body = await json_body(request)
    message = parse_message(body, service.topic)
    [result] = await _schedule(service, [message], parse_mode(body))
    raise_for_code(result.code, "schedule", result.id)
    return web.json_response(
        result_json(result), status=201 if result.code is Code.CREATED else 200
    )


async def schedule_batch(request: web.Request) -> web.Response:
    service = service_for(request)
    body = await json_body(request)
    messages = parse_batch(body, service.topic)
    results = await _schedule(service, messages, parse_mode(body))
    return web.json_response({"results": [result_json(r) for r in results]})


async def _schedule(
    service: DelayService, messages: list[ScheduleRequest], mode: Mode
) -> list[ScheduleResult]:
    def slot_of(message: ScheduleRequest) -> int:
        return slot_of_target(service, Target(message.id, message.slot_basis))

    async def call(queue: AsyncQueue, chunk: list[ScheduleRequest]) -> list[ScheduleResult]:
        return await queue.schedule_many(chunk, mode)

    return await service.brokers.each(messages, slot_of, call)


def _target(request: web.Request) -> Target:
    return Target(request.match_info["id"], request.query.get("slotBasis"))


async def get(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request)
    [info] = await service.brokers.queue_for(slot_of_target(service, target)).get_many([target])
    if info.state is State.ABSENT:
        raise NotFoundError("get", target.id)
    return web.json_response(info_json(info))


async def cancel(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request)
    queue = service.brokers.queue_for(slot_of_target(service, target))
    [outcome] = await queue.cancel_many([target])
    raise_for_code(outcome.code, "cancel", outcome.id)
    return web.json_response({"id": outcome.id, "result": outcome.code.name.lower()})


async def reschedule(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request)
    delay_ms, at_ms = parse_when(await json_body(request))
    queue = service.brokers.queue_for(slot_of_target(service, target))
    outcome = await queue.reschedule(
        target.id, delay_ms=delay_ms, at_ms=at_ms, slot_basis=target.slot_basis
    )
    return web.json_response(
        {"id": outcome.id, "result": outcome.code.name.lower(), "dueMs": outcome.at_ms}
    )
