"""Read-only routes over the whole topic: `/overview` (depths, due-time histogram, fleet,
this process's delivery counters), `/slots` (the slot map, a page at a time) and `/slots/heat`
(every slot at once in columns, for the heat map).

`/stats` answers the depths only; these add what an operator needs to see why a message did
not fire (who owns its slot, since when, whether the slot is stalled) without a shell on the
broker. Both read through `overview.TopicViews`, so their Redis cost per process is bounded
however many dashboards poll them.
"""

from __future__ import annotations

from aiohttp import web

from delayq.service.http_support import RETRY_AFTER_S, error_response, service_for
from delayq.service.overview import (
    MAX_SLOT_PAGE,
    FleetUnavailableError,
    TopicViews,
    heat_json,
    overview_json,
    read_fleet,
    slot_json,
)
from delayq.service.parsing import FieldError

TOPIC = "/v1/topics/{topic}"
VIEWS = web.AppKey("views", TopicViews)
ONLY = ("all", "attention")  # attention: stalled or unowned slots only


def setup(app: web.Application, views: TopicViews) -> None:
    app[VIEWS] = views
    app.router.add_get(TOPIC + "/overview", overview)
    app.router.add_get(TOPIC + "/slots", slots)
    app.router.add_get(TOPIC + "/slots/heat", heat)


async def overview(request: web.Request) -> web.Response:
    service = service_for(request)
    view, age_s = await request.app[VIEWS].topic.get()
    return web.json_response(overview_json(service, view, age_s))


async def heat(request: web.Request) -> web.Response:
    """Every slot's depth, oldest overdue and owner in columns: the dashboard's heat map."""
    service = service_for(request)
    view, age_s = await request.app[VIEWS].topic.get()
    return web.json_response(heat_json(service, view, age_s))


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """A small non-negative integer query parameter; a 400 naming it otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not low <= int(raw) <= high:
        raise FieldError(name, f"{name} must be an integer between {low} and {high}")
    return int(raw)


async def slots(request: web.Request) -> web.Response:
    """Slots `start`.. (at most `count`), with owner, epoch and depths; `only=attention` keeps
    just the stalled and unowned ones. `nextStart` continues the listing (null at the end)."""
    service = service_for(request)
    last = service.topic.slot_amount - 1
    start = query_int(request, "start", 0, 0, last)
    count = query_int(request, "count", MAX_SLOT_PAGE, 1, MAX_SLOT_PAGE)
    only = request.query.get("only", "all")
    if only not in ONLY:
        raise FieldError("only", f"only must be one of {', '.join(ONLY)}")
    view, age_s = await request.app[VIEWS].topic.get()
    try:
        if view.fleet is None:
            raise FleetUnavailableError(view.fleet_error or "ZooKeeper unreadable")
        held = view.fleet.held
        candidates = view.slots[start:]
        if only == "attention":
            candidates = [s for s in candidates if s.stalled or s.slot not in held]
        page = candidates[:count]
        fleet = await read_fleet(service, [s.slot for s in page])
    except FleetUnavailableError as error:
        # a slot map is about ownership: without it, say so (the overview still has depths)
        response = error_response(503, f"slot ownership unknown: {error}")
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    following = candidates[count] if len(candidates) > count else None
    return web.json_response(
        {
            "slotAmount": service.topic.slot_amount,
            "members": list(fleet.members),
            "ageMs": int(age_s * 1000),
            "slots": [slot_json(s, fleet) for s in page],
            "nextStart": following.slot if following is not None else None,
        }
    )
