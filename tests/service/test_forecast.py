"""The forecast of due load on a real `delayq serve` and redis-server: what
`delayq_due_messages{within}` says will fall due is what then falls due.

A pull topic is used because nothing leaves it unless the test leases: the messages stay in the
due index, and what fell due is exactly what a lease then gets.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import redis.asyncio
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from delayq.local.processes import ServeProcess
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.model import ScheduleRequest
from delayq.service.metrics import FORECAST_WINDOWS, ServiceMetrics

MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
SOON_MS = 3_000  # the group that falls due while the test waits
# group -> (first delay ms, messages); one group inside each band of the windows, none
# between SOON_MS and 2 minutes, so leasing after SOON_MS sees everything the minute brings
GROUPS = {
    "overdue": (0, 3),  # due already: the backlog, not the forecast
    "soon": (SOON_MS, 5),
    "minutes": (2 * MINUTE_MS, 7),
    "hour": (30 * MINUTE_MS, 11),
    "day": (2 * HOUR_MS, 13),
    "later": (2 * DAY_MS, 17),
}
EXPECTED = {"1m": 5, "5m": 5 + 7, "1h": 5 + 7 + 11, "1d": 5 + 7 + 11 + 13}


async def _forecast(session: aiohttp.ClientSession, process: ServeProcess) -> dict[str, int]:
    async with session.get(process.url + "/metrics") as answer:
        assert answer.status == 200
        text = await answer.text()
    return {
        sample.labels["within"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "delayq_due_messages"
        for sample in family.samples
        if sample.labels["topic"] == process.config.topic
    }


async def test_the_forecast_counts_what_then_falls_due(
    pull_process: ServeProcess, async_redis_client: redis.asyncio.Redis
) -> None:
    queue = AsyncQueue(async_redis_client, pull_process.config.to_topic())
    await queue.schedule_many(
        [
            ScheduleRequest(f"{group}-{i}", b"", delay_ms=first_ms and first_ms + i * 10)
            for group, (first_ms, count) in GROUPS.items()
            for i in range(count)
        ]
    )
    leases_url = f"{pull_process.url}/v1/topics/{pull_process.config.topic}/leases"
    async with aiohttp.ClientSession() as session:
        seen: dict[str, int] = {}

        async def forecast_read() -> bool:
            seen.update(await _forecast(session, pull_process))
            return seen == EXPECTED

        # the first scrape computes it; eventually only for a scrape before the schedule
        await eventually(forecast_read, 10, f"forecast {EXPECTED}")

        leased: list[str] = []

        async def lease_due() -> bool:
            async with session.post(leases_url, json={"max": 100}) as answer:
                assert answer.status == 200, await answer.text()
                leased.extend(m["id"] for m in (await answer.json())["leases"])
            return len(leased) >= 3 + EXPECTED["1m"]

        await eventually(lease_due, 10 + SOON_MS / 1000, "the minute's messages fall due")
        # the forecast's minute, and nothing else, fell due (plus the backlog it left out)
        soon = sorted(m for m in leased if not m.startswith("overdue-"))
        assert soon == [f"soon-{i}" for i in range(EXPECTED["1m"])]
        assert sorted(leased) == sorted([*(f"overdue-{i}" for i in range(3)), *soon])
        async with session.post(leases_url, json={"max": 100}) as answer:
            assert (await answer.json())["leases"] == []


def test_the_keda_example_queries_the_forecast_the_service_exports() -> None:
    """The documented ScaledObject names series, labels and windows that exist."""
    example = Path(__file__).parents[2] / "examples" / "scaling" / "keda-due-load.yaml"
    scaled = yaml.safe_load(example.read_text())
    assert scaled["kind"] == "ScaledObject"
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    exported = {
        metric._name: set(metric._labelnames)
        for metric in vars(ServiceMetrics("ns", "t")).values()
        if isinstance(metric, MetricWrapperBase)
    }
    selectors = re.findall(r"(delayq_[a-z_]+)\{([^}]*)\}", query)
    assert {name for name, _ in selectors} == {"delayq_due_messages", "delayq_messages"}
    windows = {label for label, _ in FORECAST_WINDOWS}
    for name, matchers in selectors:
        for label, value in re.findall(r'([a-z_]+)="([^"]*)"', matchers):
            assert label in exported[name], f"{name} has no label {label}"
            if label == "within":
                assert value in windows
