"""Regenerate the dashboard screenshots in docs/img/ (referenced by docs/dashboard.md).

    python3 scripts/screenshots.py [--output docs/img]

Starts what it needs and stops it again: a throw-away redis-server, a ZooKeeper, two
`delayq serve` processes sharing a 32-slot pull topic, and a small pull consumer so the page
has deliveries, lateness, dead letters and a stalled slot to show; then one `delayq serve` of a
16,384-slot topic for the slot map's heat map. The browser is Debian's
headless Chromium through /usr/bin/chromedriver (`scripts/setup.sh` installs both); nothing is
downloaded. Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from tests.service.dashboard_support import (  # noqa: E402
    BIG_STALLED_SLOT,
    NAMESPACE,
    TOPIC,
    WAIT_S,
    Fleet,
    big_topic,
    chrome,
    fleet,
    loads,
    message_hash,
    open_dashboard,
    wait_for_load,
)

from delayq.local.redis_server import RedisServer  # noqa: E402
from delayq.local.zookeeper_server import ZooKeeperServer  # noqa: E402
from delayq.queue.keys import Part, SlotKeys  # noqa: E402

SLOTS = 32


def consume(served: Fleet, stop: threading.Event) -> None:
    """Lease and ack due messages from both processes until told to stop (long polls of at
    most 200 ms, so stopping is prompt)."""
    while not stop.is_set():
        for number in range(len(served.processes)):
            body = {"max": 50, "waitMs": 200}
            leases = served.api("POST", "/leases", body, process=number)["leases"]
            if leases:
                tokens = [lease["token"] for lease in leases]
                served.api("POST", "/leases/ack", {"tokens": tokens}, process=number)


def populate(served: Fleet) -> None:
    """Messages due steadily over the next half minute (deliveries to show), more spread over
    minutes to days (the histogram), and a few dead letters."""
    for number in range(250):
        delay_ms = (
            1_000 + number * 200
            if number < 150
            else [45_000, 900_000, 5 * 3_600_000][number % 3] + number * 1000
        )
        served.schedule(
            f"order-{number:04d}",
            delay_ms if number % 10 else 3 * 86_400_000 + number,
            payload=f'{{"order": {number}, "sku": "A-{number % 7}", "qty": {1 + number % 3}}}',
            headers={"tenant": "acme", "trace-id": f"t-{number:06x}"},
        )
    for number in range(4):
        served.schedule(f"invoice-{number}", 0, payload=f'{{"invoice": {number}}}')
    served.kill_to_dead(4, "POST https://billing.example/hook: HTTP 500 after 16 attempts")
    served.api(
        "PUT",
        "/schedules/daily-report",
        {"cron": "0 7 * * *", "timeZone": "Europe/Berlin", "payload": '{"report": "daily"}'},
    )
    served.api("PUT", "/schedules/cache-warmup", {"everyMs": 900_000, "catchUp": "skip"})


def stall_one_slot(served: Fleet, redis_url: str) -> None:
    """A slot whose due message nobody has claimed for a while (the consumer has stopped):
    the slot map must make it stand out."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        answer = served.schedule("stuck-report", 60_000, payload='{"report": "daily"}')
        now_s, now_us = client.time()
        store = SlotKeys(NAMESPACE, TOPIC, answer["slot"]).key(Part.STORE)
        client.zadd(store, {"stuck-report": now_s * 1000 + now_us // 1000 - 95_000})
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="delayq-screens-"))
    with (
        RedisServer() as redis_server,
        ZooKeeperServer() as zk,
        fleet(redis_server.url, zk.hosts, workdir, 2, SLOTS) as served,
    ):
        capture(served, redis_server.url, args.output)
        with big_topic(redis_server.url, workdir) as big:
            capture_heat_map(big, args.output)
    for name in sorted(p.name for p in args.output.glob("dashboard-*.png")):
        print(f"wrote {args.output / name}")
    return 0


def capture(served: Fleet, redis_url: str, output: Path) -> None:
    """Fill the topic, then photograph each page as a reader would see it."""
    stop = threading.Event()
    consumer = threading.Thread(target=consume, args=(served, stop), daemon=True)
    driver = chrome(1280, 860)
    try:
        populate(served)
        consumer.start()
        open_dashboard(driver, served.url)
        for polls in range(2, 8):  # half a minute of polls (5 s each): rates and lateness
            wait_for_load(driver, "overview", polls)
        shoot(driver, output / "dashboard-overview.png")
        stop.set()
        consumer.join(WAIT_S)
        stall_one_slot(served, redis_url)

        before = loads(driver, "slots")
        driver.get(f"{served.url}/ui#/slots")
        wait_for_load(driver, "slots", before + 1)
        WebDriverWait(driver, WAIT_S).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#slots-table tr.stalled"),
            "the stalled slot marked (the next poll after the view's cache)",
        )
        driver.set_window_size(1280, 1200)  # every one of the 32 slots
        shoot(driver, output / "dashboard-slots.png")
        driver.set_window_size(1280, 860)

        before = loads(driver, "message")
        driver.get(f"{served.url}/ui{message_hash('order-0240')}")
        wait_for_load(driver, "message", before + 1)
        shoot(driver, output / "dashboard-message.png")

        before = loads(driver, "dead")
        driver.get(f"{served.url}/ui#/dead")
        wait_for_load(driver, "dead", before + 1)
        driver.find_element(By.CSS_SELECTOR, "#dead-table tbody input").click()
        driver.find_element(By.ID, "dead-redrive-selected").click()
        WebDriverWait(driver, WAIT_S).until(
            lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None,
            "the confirmation dialog",
        )
        shoot(driver, output / "dashboard-dead.png")
        driver.find_element(By.ID, "confirm-no").click()

        before = loads(driver, "schedules")
        driver.get(f"{served.url}/ui#/schedules")
        wait_for_load(driver, "schedules", before + 1)
        shoot(driver, output / "dashboard-schedules.png")
    finally:
        stop.set()
        driver.quit()
        if consumer.is_alive():
            consumer.join(5)


def capture_heat_map(big: Fleet, output: Path) -> None:
    """The slot map of a 16,384-slot topic: the heat map, and the table of a selection."""
    driver = chrome(1280, 1300)
    try:
        open_dashboard(driver, big.url, page="slots")
        driver.find_element(By.ID, "slots-from").send_keys(str(BIG_STALLED_SLOT - 2))
        driver.find_element(By.ID, "slots-to").send_keys(str(BIG_STALLED_SLOT + 2))
        before = loads(driver, "slots")
        driver.find_element(By.CSS_SELECTOR, "#slots-range button").click()
        wait_for_load(driver, "slots", before + 1)
        shoot(driver, output / "dashboard-heatmap.png")
    finally:
        driver.quit()


def shoot(driver: WebDriver, path: Path) -> None:
    if not driver.save_screenshot(str(path)):
        raise RuntimeError(f"the browser could not write {path}")


if __name__ == "__main__":
    raise SystemExit(main())
