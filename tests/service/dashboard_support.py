"""What the dashboard's browser tests and `scripts/screenshots.py` share: a headless Chromium
from the Debian packages (never a downloaded browser or driver), and a small fleet of real
`delayq serve` processes on a real redis-server and ZooKeeper.

Selenium is pointed at `/usr/bin/chromedriver` explicitly, so Selenium Manager never looks for
(or downloads) a driver; `scripts/setup.sh` installs `chromium` and `chromium-driver`.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.waiting import wait_until
from delayq.queue import Queue, ScheduleRequest, Topic
from delayq.queue.keys import Part, SlotKeys
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "dashboard-admin-token"
READ_TOKEN = "dashboard-viewer-token"
NAMESPACE, TOPIC = "shop", "dash"
WAIT_S = 20.0


def chrome(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    """Headless Chromium from /usr/bin with its browser console log kept for the tests."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} missing: run scripts/setup.sh (apt chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


@dataclass
class Fleet:
    """`delayq serve` processes of one pull topic sharing its slots through ZooKeeper."""

    processes: list[ServeProcess] = field(default_factory=list)
    topic: str = TOPIC

    @property
    def url(self) -> str:
        return self.processes[0].url

    def api(
        self, method: str, path: str, body: Any = None, token: str = TOKEN, process: int = 0
    ) -> Any:
        """One JSON call to a process's topic API (path below /v1/topics/<topic>)."""
        url = f"{self.processes[process].url}/v1/topics/{self.topic}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def schedule(self, message_id: str, delay_ms: int, **extra: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.api(
            "POST", "/messages", {"id": message_id, "delayMs": delay_ms, **extra}
        )
        return answer

    def kill_to_dead(self, count: int, reason: str, *, including: str | None = None) -> list[str]:
        """Lease `count` due messages (each process leases from the slots it owns) and nack
        them straight to dead with `reason`; with `including`, go on until that id is among
        them (an earlier test's message may come due again first and be leased instead)."""
        killed: list[str] = []

        def done() -> bool:
            return len(killed) >= count and (including is None or including in killed)

        def lease_and_kill() -> bool:
            for number in range(len(self.processes)):
                wanted = {"max": max(1, count - len(killed))}
                leases = self.api("POST", "/leases", wanted, process=number)["leases"]
                if leases:
                    tokens = [lease["token"] for lease in leases]
                    body = {"tokens": tokens, "dead": True, "reason": reason}
                    self.api("POST", "/leases/nack", body, process=number)
                    killed.extend(lease["id"] for lease in leases)
                if done():
                    return True
            return False

        wait_until(lease_and_kill, WAIT_S, f"{count} due messages sent to dead", interval_s=0.1)
        return killed

    def ready(self) -> bool:
        for process in self.processes:
            if not process.running():
                raise RuntimeError(f"delayq serve exited: {process.log_path.read_text()}")
            try:
                with urllib.request.urlopen(process.url + "/readyz", timeout=2) as response:
                    if response.status != 200:
                        return False
            except (urllib.error.URLError, OSError):
                return False
        return True


@contextmanager
def fleet(
    redis_url: str, zookeeper_hosts: str, workdir: Path, processes: int = 2, slot_amount: int = 16
) -> Iterator[Fleet]:
    base = ServiceConfig(
        redis_url=redis_url,
        namespace=NAMESPACE,
        topic=TOPIC,
        slot_amount=slot_amount,
        topic_type=TopicType.PULL,
        api_token=TOKEN,
        read_token=READ_TOKEN,
        zookeeper_connect=zookeeper_hosts,
        zookeeper_session_timeout_ms=4000,
        grace_ms=2000,
        objectives_lateness_p99_ms=1000,  # drawn on the overview's lateness chart
    )
    started = Fleet()
    try:
        for number in range(processes):
            config = dataclasses.replace(base, port=free_port(), member_id=f"web-{number}")
            log = workdir / f"serve-{number}.log"
            started.processes.append(ServeProcess(config, log).start())
        wait_until(started.ready, 60, "delayq serve processes ready")
        yield started
    finally:
        stop_all(started.processes)


BIG_NAMESPACE, BIG_TOPIC, BIG_SLOTS = "heat", "big", 16_384
BIG_FULL_MESSAGES = 300  # in the slot of slot basis "full", the darkest of the heat map
BIG_STALLED_SLOT = 9_000  # holds a message due a minute ago that nobody claims


@contextmanager
def big_topic(redis_url: str, workdir: Path, spread: int = 20_000) -> Iterator[Fleet]:
    """One `delayq serve` owning every slot of a 16,384-slot pull topic (no ZooKeeper): `spread`
    messages an hour away spread by id, BIG_FULL_MESSAGES more in one slot, and a stalled slot
    (the heat map's test and its screenshot)."""
    topic = Topic(BIG_TOPIC, namespace=BIG_NAMESPACE, slot_amount=BIG_SLOTS)
    client = redis.Redis.from_url(redis_url)
    queue = Queue(client, topic)
    try:
        queue.schedule_many(
            [
                ScheduleRequest(f"full-{i}", b"", delay_ms=3_600_000, slot_basis="full")
                for i in range(BIG_FULL_MESSAGES)
            ]
            + [ScheduleRequest(f"m-{i}", b"", delay_ms=3_600_000) for i in range(spread)]
        )
        seconds, micros = client.time()
        stalled = SlotKeys(BIG_NAMESPACE, BIG_TOPIC, BIG_STALLED_SLOT)
        client.zadd(stalled.key(Part.STORE), {"stuck": seconds * 1000 + micros // 1000 - 60_000})
        client.hset(stalled.key(Part.MSG), "stuck", "0:::0:")
    finally:
        queue.close()
    config = ServiceConfig(
        redis_url=redis_url,
        namespace=BIG_NAMESPACE,
        topic=BIG_TOPIC,
        slot_amount=BIG_SLOTS,
        topic_type=TopicType.PULL,
        api_token=TOKEN,
        port=free_port(),
        grace_ms=2000,
    )
    served = Fleet([ServeProcess(config, workdir / "serve-big.log").start()], BIG_TOPIC)
    try:
        wait_until(served.ready, 120, "delayq serve of 16,384 slots ready")
        yield served
    finally:
        stop_all(served.processes)


def open_dashboard(
    driver: webdriver.Chrome, url: str, token: str = TOKEN, page: str = "overview"
) -> None:
    """Load the page and give it the token the way a person does: the page first says it needs
    one (its only console error: that 401), then the form, then the page's data."""
    driver.get("about:blank")
    driver.get(f"{url}/ui#/{page}")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: "needs a token" in d.find_element(By.ID, "error").text, "the token prompt"
    )
    unexpected = [e for e in console_errors(driver) if "401" not in e["message"]]
    assert unexpected == [], unexpected
    before = loads(driver, page)
    driver.find_element(By.ID, "token-input").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#token-form button").click()
    if page in ("overview", "slots", "dead", "schedules"):
        wait_for_load(driver, page, before + 1)
    # a page reading two routes at once got two 401s before the token: the prompt shows at the
    # first, and the second may reach the console log only now (a test's later check of the
    # console would see it)
    late = [e for e in console_errors(driver) if "401" not in e["message"]]
    assert late == [], late


def loads(driver: WebDriver, page: str) -> int:
    value = driver.find_element(By.ID, f"page-{page}").get_attribute("data-loads")
    return int(value or 0)


def wait_for_load(driver: WebDriver, page: str, at_least: int) -> None:
    WebDriverWait(driver, WAIT_S).until(
        lambda d: loads(d, page) >= at_least, f"the {page} page to load {at_least} time(s)"
    )


def definitions(driver: WebDriver, list_id: str) -> dict[str, str]:
    """A <dl>'s terms and values as shown."""
    terms = driver.find_elements(By.CSS_SELECTOR, f"#{list_id} dt")
    values = driver.find_elements(By.CSS_SELECTOR, f"#{list_id} dd")
    return {t.text: v.text for t, v in zip(terms, values, strict=True)}


def console_errors(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """SEVERE entries of the browser console since the last call (reading drains it)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def message_hash(message_id: str, slot: int | None = None) -> str:
    """The message page's address: the percent-encoded id, and `?slot=N` when the page should
    look in that slot (as the dead list's links do)."""
    return "#/message/" + quote(message_id, safe="") + ("" if slot is None else f"?slot={slot}")
