"""How fast the dashboard's overview renders for a big topic (docs/dashboard.md).

    python3 bench/bench_dashboard.py [--slots 16384] [--pending 1000000] [--runs 5]

Starts a throw-away redis-server, fills a pull topic of `--slots` slots with `--pending`
messages through the engine (due times spread over the next three days, 1% overdue), starts one
`delayq serve` owning every slot (embedded ownership, loopback, no token) and measures:

- `overview_api_ms`: GET /overview with a cold cache (every slot read: the server's work);
- `overview_render_ms`: headless Chromium (Debian's, /usr/bin/chromedriver) from navigation to
  the overview showing its numbers, cold cache each run;
- `slots_render_ms`: the same for the slot map's first page (256 rows);
- `metrics_forecast_ms` and `metrics_cached_ms`: GET /metrics when the forecast of due load
  (`delayq_due_messages`, every owned slot counted) is older than its refresh period, and
  right after, when it is not: the difference is what the forecast costs once per period.

Each run waits out the service's 1 s view cache first, so every figure includes reading all
slots. Prints one JSON object. A figure, never a test assertion.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from tests.service.dashboard_support import chrome, loads  # noqa: E402

from delayq.local.ports import free_port  # noqa: E402
from delayq.local.processes import ServeProcess  # noqa: E402
from delayq.local.redis_server import RedisServer  # noqa: E402
from delayq.local.waiting import wait_until  # noqa: E402
from delayq.queue.client import Queue  # noqa: E402
from delayq.queue.model import ScheduleRequest  # noqa: E402
from delayq.queue.topic import Topic, TopicType  # noqa: E402
from delayq.service.config import ServiceConfig  # noqa: E402
from delayq.service.overview import CACHE_S, FORECAST_MAX_AGE_S  # noqa: E402

NAMESPACE, TOPIC = "bench", "big"
DAY_MS = 86_400_000


def fill(url: str, slots: int, pending: int, batch: int) -> float:
    """Schedule `pending` messages; returns messages per second."""
    topic = Topic(TOPIC, namespace=NAMESPACE, slot_amount=slots, topic_type=TopicType.PULL)
    queue = Queue(redis.Redis.from_url(url), topic)
    rng = random.Random(7)
    started = time.monotonic()
    try:
        for first in range(0, pending, batch):
            requests = [
                ScheduleRequest(
                    f"m-{number}",
                    b'{"n": 1}',
                    delay_ms=0 if number % 100 == 0 else rng.randrange(1, 3 * DAY_MS),
                )
                for number in range(first, min(pending, first + batch))
            ]
            queue.schedule_many(requests)
    finally:
        queue.close()
    return pending / (time.monotonic() - started)


def rendered(driver: WebDriver, page: str) -> Callable[[], bool]:
    return lambda: loads(driver, page) >= 1


def get_ms(url: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as answer:
        answer.read()
    return (time.monotonic() - started) * 1000


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--slots", type=int, default=16384)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, Any] = {"slots": args.slots, "pending": args.pending}
    workdir = Path(tempfile.mkdtemp(prefix="delayq-bench-dash-"))
    with RedisServer() as redis_server:
        result["fill_per_s"] = round(fill(redis_server.url, args.slots, args.pending, args.batch))
        client = redis.Redis.from_url(redis_server.url)
        result["redis_used_memory_mb"] = round(int(client.info("memory")["used_memory"]) / 2**20)
        client.close()
        config = ServiceConfig(
            redis_url=redis_server.url,
            namespace=NAMESPACE,
            topic=TOPIC,
            slot_amount=args.slots,
            topic_type=TopicType.PULL,
            port=free_port(),
            grace_ms=2000,
        )
        process = ServeProcess(config, workdir / "serve.log").start()
        driver = chrome()
        try:

            def ready() -> bool:
                try:
                    return get_ms(process.url + "/readyz") >= 0
                except OSError:
                    return False

            wait_until(ready, 300, "delayq serve ready", interval_s=0.2)
            base = f"{process.url}/v1/topics/{TOPIC}"
            api: list[float] = []
            overview: list[float] = []
            slot_map: list[float] = []
            for _ in range(args.runs):
                time.sleep(CACHE_S + 0.1)  # a cold cache: the figure includes reading every slot
                api.append(get_ms(base + "/overview"))
            forecast: list[float] = []
            cached: list[float] = []
            for _ in range(args.runs):
                time.sleep(FORECAST_MAX_AGE_S + 0.1)
                forecast.append(get_ms(process.url + "/metrics"))
                cached.append(get_ms(process.url + "/metrics"))
            result["metrics_forecast_ms"] = summary(forecast)
            result["metrics_cached_ms"] = summary(cached)
            for page, into in (("overview", overview), ("slots", slot_map)):
                for _ in range(args.runs):
                    driver.get("about:blank")
                    time.sleep(CACHE_S + 0.1)
                    started = time.monotonic()
                    driver.get(f"{process.url}/ui#/{page}")
                    wait_until(rendered(driver, page), 120, f"{page} rendered")
                    into.append((time.monotonic() - started) * 1000)
            result["overview_api_ms"] = summary(api)
            result["overview_render_ms"] = summary(overview)
            result["slots_render_ms"] = summary(slot_map)
            with urllib.request.urlopen(base + "/overview", timeout=60) as answer:
                depth = json.loads(answer.read())["depth"]
            result["depth"] = depth
        finally:
            driver.quit()
            process.terminate()
            process.wait()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
