"""Dead-queue routes: list (paged across slots), redrive and purge (listed ids, or all)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from aiohttp import web

from delayq.queue.client import AsyncQueue
from delayq.queue.codes import Code
from delayq.queue.model import MessageInfo, Outcome, Target
from delayq.service.envelope import info_json
from delayq.service.http_support import json_body, service_for
from delayq.service.parsing import parse_count, parse_cursor, parse_dead_targets
from delayq.service.routes_overview import VIEWS
from delayq.service.service import DelayService

DEAD = "/v1/topics/{topic}/dead"
NOT_DEAD = Code.WRONG_STATE.name.lower()  # a listed id's result when it is not dead

PerSlot = Callable[[AsyncQueue, int, Sequence[str]], Awaitable[list[Outcome]]]
AllSlots = Callable[[AsyncQueue, list[int]], Awaitable[int]]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(DEAD, list_dead)
    router.add_post(DEAD + "/redrive", redrive)
    router.add_post(DEAD + "/purge", purge)
    router.add_get("/v1/topics/{topic}/stats", stats)
    router.add_post("/v1/topics/{topic}/pause", pause)
    router.add_post("/v1/topics/{topic}/resume", resume)


async def list_dead(request: web.Request) -> web.Response:
    """One page of dead messages, slot by slot; `nextCursor` is null after the last slot.
    A slot a doubling switched (`Brokers.stored_in`) is read in its halves, one after the
    other (the cursor's offset runs on through the second), its messages listed under the
    slot number the topic has until the doubling ends: sent back as a target's `slot`, it is
    refused until then (SLOT_MOVING), never looked for in the wrong slot."""
    service = service_for(request)
    slot, offset = parse_cursor(request.query.get("cursor"), service.topic)
    count = parse_count(request.query.get("count"), 100)
    found: list[MessageInfo] = []
    while slot < service.topic.slot_amount and len(found) < count:
        queue, stored = service.brokers.stored_in(slot)
        skip, listed, total = offset, 0, 0
        for part in stored:
            if len(found) >= count:
                total = -1  # a half not read yet: the slot is not done
                break
            page = await queue.dead_page(part, skip, count - len(found))
            found += [replace(m, slot=slot) for m in page.messages]
            listed += len(page.messages)
            skip, total = max(0, skip - page.total), total + page.total
        offset += listed
        if not listed or 0 <= total <= offset:
            slot, offset = slot + 1, 0
    cursor = f"{slot}:{offset}" if slot < service.topic.slot_amount else None
    return web.json_response({"messages": [info_json(m) for m in found], "nextCursor": cursor})


async def _by_slot(
    service: DelayService, targets: list[Target], action: PerSlot
) -> list[dict[str, str]]:
    """`action` on each target's slot, where it is stored (`Brokers.place`: in its half once
    a doubling switched the slot), one call per slot."""
    ids: dict[tuple[int, int], tuple[AsyncQueue, list[str]]] = {}
    for target in targets:
        queue, slot = service.brokers.place(target)
        ids.setdefault((id(queue), slot), (queue, []))[1].append(target.id)
    results = []
    for (_, slot), (queue, slot_ids) in ids.items():
        outcomes = await action(queue, slot, slot_ids)
        results += [{"id": o.id, "result": o.code.name.lower()} for o in outcomes]
    return results


async def _dead_action(request: web.Request, per_slot: PerSlot, every: AllSlots) -> web.Response:
    service = service_for(request)
    targets = parse_dead_targets(await json_body(request), service.topic)
    if targets is None:
        return web.json_response({"moved": await service.brokers.each_broker(every)})
    results = await _by_slot(service, targets, per_slot)
    # an id that is not dead (unknown, forgotten, or live) is not found among the dead: a 404,
    # as `delayq dead` exits "not found", with every id's result (the others were done)
    missing = any(r["result"] == NOT_DEAD for r in results)
    return web.json_response({"results": results}, status=404 if missing else 200)


async def redrive(request: web.Request) -> web.Response:
    return await _dead_action(request, AsyncQueue.redrive, AsyncQueue.redrive_all)


async def purge(request: web.Request) -> web.Response:
    return await _dead_action(request, AsyncQueue.purge, AsyncQueue.purge_all)


async def stats(request: web.Request) -> web.Response:
    service = service_for(request)
    topic_stats = await service.brokers.stats()
    return web.json_response(
        {
            "scheduled": topic_stats.scheduled,
            "due": topic_stats.due,
            "prepared": topic_stats.prepared,
            "dead": topic_stats.dead,
            "nextDueMs": topic_stats.next_due_ms,
            "oldestOverdueMs": topic_stats.oldest_overdue_ms,
            "ownedSlots": service.owned_slots,
            "paused": await service.read_paused(),
        }
    )


async def pause(request: web.Request) -> web.Response:
    """Stop delivering (claims stop within a second on every process; scheduling goes on)."""
    return await _set_paused(request, True)


async def resume(request: web.Request) -> web.Response:
    """Deliver again: the backlog drains under the usual flow control."""
    return await _set_paused(request, False)


async def _set_paused(request: web.Request, paused: bool) -> web.Response:
    await service_for(request).pause(paused)
    request.app[VIEWS].topic.forget()  # this process's overview shows it at its next read
    return web.json_response({"paused": paused})
