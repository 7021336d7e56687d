"""The dashboard (`/ui`) used as a person would: headless Chromium (Debian's, driven by
Selenium through /usr/bin/chromedriver) against two real `delayq serve` processes sharing a
pull topic through a real ZooKeeper, on the session's real redis-server.

What is checked: pages load without console errors, the numbers shown are the API's, cancel,
reschedule, redrive (a message scheduled with a slot basis included, from the list and from its
own page opened through the list's link), purge, pause and resume change what Redis holds, XSS
attempts in ids, payloads, headers and reasons render as inert text, the read-only token can
look but not act, and the page is usable from the keyboard. Every wait has a deadline
(WebDriverWait or `wait_until`).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
import redis
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Target, Topic
from delayq.queue.keys import Part, SlotKeys, paused_key
from delayq.service.overview import STALLED_AFTER_MS
from tests.service.dashboard_support import (
    NAMESPACE,
    READ_TOKEN,
    TOPIC,
    WAIT_S,
    Fleet,
    chrome,
    console_errors,
    definitions,
    fleet,
    loads,
    message_hash,
    open_dashboard,
    wait_for_load,
)

SLOTS = 16
DEAD_IDS = ("dl-a", "dl-b", "dl-c")
PAUSED_KEY = paused_key(Topic(TOPIC, namespace=NAMESPACE, slot_amount=SLOTS))


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServer,
    zookeeper_server: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("dashboard")
    with fleet(redis_server.url, zookeeper_server.hosts, workdir, 2, SLOTS) as started:
        yield started


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    browser = chrome()
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def key(slot: int, part: Part) -> str:
    return SlotKeys(NAMESPACE, TOPIC, slot).key(part)


def dead_total(store: redis.Redis) -> int:
    return sum(int(store.zcard(key(slot, Part.DEAD))) for slot in range(SLOTS))


def confirm(driver: webdriver.Chrome) -> None:
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None,
        "the confirmation dialog",
    )
    driver.find_element(By.ID, "confirm-yes").click()


def status_text(driver: webdriver.Chrome, element_id: str, contains: str) -> str:
    def shown(d: webdriver.Chrome) -> str | None:
        text: str = d.find_element(By.ID, element_id).text
        return text if contains in text else None

    return str(WebDriverWait(driver, WAIT_S).until(shown, f"{element_id} to say {contains!r}"))


def test_overview_shows_the_apis_numbers_without_console_errors(
    served: Fleet, driver: webdriver.Chrome
):
    served.api("POST", "/dead/purge", {"all": True})
    for number, delay_ms in enumerate((0, 0, 20_000, 600_000, 7_200_000, 3 * 86_400_000)):
        served.schedule(f"ov-{number}", delay_ms, payload=f"p{number}")
    served.kill_to_dead(1, "receiver answered 500")
    open_dashboard(driver, served.url)

    def agrees(d: webdriver.Chrome) -> bool:
        api = served.api("GET", "/overview")
        depth, histogram = api["depth"], api["dueHistogram"]
        shown = definitions(d, "depth")
        expected = {
            "Waiting (not yet due)": str(depth["scheduled"] - depth["due"]),
            "Due, not yet claimed": str(depth["due"]),
            "In flight (leased)": str(depth["prepared"]),
            "Dead": str(depth["dead"]),
        }
        rows = d.find_elements(By.CSS_SELECTOR, "#histogram tbody tr")
        bars = [row.find_element(By.CSS_SELECTOR, "td.num").text for row in rows]
        keys = ("overdue", "nextMinute", "nextHour", "nextDay", "later")
        return all(shown[k] == v for k, v in expected.items()) and bars == [
            str(histogram[k]) for k in keys
        ]

    WebDriverWait(driver, WAIT_S).until(agrees, "the overview to show the API's numbers")
    api = served.api("GET", "/overview")
    assert api["depth"]["dead"] == 1
    assert api["dueHistogram"]["nextMinute"] == 1
    assert api["dueHistogram"]["later"] == 1
    assert (api["latenessObjectiveMs"], api["objectiveWindowMs"]) == (1000, 300_000)
    objective = definitions(driver, "process")["Lateness objective"]
    assert objective.startswith("p99 ≤ 1.0 s over 5 min"), objective
    assert driver.find_elements(By.CSS_SELECTOR, "#lateness-chart line.objective")
    shown_fleet = definitions(driver, "fleet")
    assert shown_fleet["Slots held"] == f"{SLOTS} of {SLOTS}"
    assert shown_fleet["Processes"] == "2: web-0, web-1"
    assert console_errors(driver) == []
    for number in range(6):  # the due ones would stall their slots for the next tests
        served.api("DELETE", f"/messages/ov-{number}")


def test_slot_map_matches_the_api_and_a_stalled_slot_stands_out(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    scheduled = served.schedule("stuck", 60_000)
    slot = scheduled["slot"]
    now_s, now_us = store.time()
    store.zadd(key(slot, Part.STORE), {"stuck": now_s * 1000 + now_us // 1000 - 60_000})
    open_dashboard(driver, served.url, page="slots")

    def stalled_row(d: webdriver.Chrome) -> bool:
        row = d.find_element(By.CSS_SELECTOR, f'#slots-table tr[data-slot="{slot}"]')
        return "stalled" in (row.get_attribute("class") or "")

    WebDriverWait(driver, WAIT_S).until(stalled_row, "the stalled slot to be marked")
    row = driver.find_element(By.CSS_SELECTOR, f'#slots-table tr[data-slot="{slot}"]')
    cells = row.find_elements(By.CSS_SELECTOR, "th, td")
    assert cells[1].text == "⚠ stalled"  # a word and a symbol, not only a colour
    api = served.api("GET", "/slots")
    shown = {
        int(r.get_attribute("data-slot") or -1): r.find_elements(By.CSS_SELECTOR, "td")[1].text
        for r in driver.find_elements(By.CSS_SELECTOR, "#slots-table tbody tr")
    }
    assert shown == {s["slot"]: s["owner"] for s in api["slots"]}
    assert set(shown.values()) == {"web-0", "web-1"}
    epoch = store.get(key(slot, Part.EPOCH))
    assert cells[3].text == epoch
    assert api["slots"][slot]["oldestOverdueMs"] >= STALLED_AFTER_MS
    select = driver.find_element(By.ID, "slots-only")
    select.send_keys("only")  # keyboard: pick "only stalled or unowned"
    WebDriverWait(driver, WAIT_S).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#slots-table tbody tr")) == 1,
        "only the stalled slot listed",
    )
    served.api("DELETE", "/messages/stuck")
    assert console_errors(driver) == []


def test_message_lookup_reschedule_and_cancel_change_redis(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    scheduled = served.schedule(
        "order 7/é", 60_000, payload="{}", headers={"tenant": "acme"}, priority=7, group="acme/é"
    )
    store_key = key(scheduled["slot"], Part.STORE)
    open_dashboard(driver, served.url, page="overview")
    before = loads(driver, "message")
    driver.get(f"{served.url}/ui{message_hash('order 7/é')}")
    wait_for_load(driver, "message", before + 1)
    fields = definitions(driver, "message-fields")
    assert (fields["Id"], fields["State"], fields["Slot"]) == (
        "order 7/é",
        "scheduled",
        str(scheduled["slot"]),
    )
    assert (fields["Attempts"], fields["Priority"], fields["Group"]) == ("0", "7", "acme/é")

    delay = driver.find_element(By.ID, "reschedule-delay")
    delay.send_keys("3600", Keys.ENTER)  # the keyboard submits the form
    status_text(driver, "message-status", "rescheduled")
    due = store.zscore(store_key, "order 7/é")
    assert due is not None
    assert due >= scheduled["dueMs"] + 3_500_000

    # keyboard: the dialog opens on "Keep", so Enter keeps the message
    driver.find_element(By.ID, "cancel-button").send_keys(Keys.ENTER)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.switch_to.active_element.get_attribute("id") == "confirm-no",
        "focus on Keep",
    )
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is None, "dialog closed"
    )
    assert store.zscore(store_key, "order 7/é") == due

    driver.find_element(By.ID, "cancel-button").click()
    confirm(driver)
    status_text(driver, "message-status", "cancelled")
    wait_until(lambda: store.zscore(store_key, "order 7/é") is None, WAIT_S, "the message gone")
    assert console_errors(driver) == []


def test_dead_letters_redrive_selected_then_purge_all(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    served.api("POST", "/dead/purge", {"all": True})
    for priority, name in enumerate(DEAD_IDS):  # the first without a group
        grouped = {"group": f"g{priority}"} if priority else {}
        served.schedule(name, 0, priority=priority, **grouped)
    killed = served.kill_to_dead(3, "HTTP 500 from receiver")
    assert dead_total(store) == 3
    open_dashboard(driver, served.url, page="dead")
    rows = driver.find_elements(By.CSS_SELECTOR, "#dead-table tbody tr")
    cells = [[td.text for td in r.find_elements(By.CSS_SELECTOR, "td")] for r in rows]
    assert sorted(c[1] for c in cells) == sorted(killed)
    # each row's priority and group (the columns after the attempts), those it was scheduled with
    assert sorted((c[1], c[4], c[5]) for c in cells) == [
        (n, str(p), f"g{p}" if p else "—") for p, n in enumerate(DEAD_IDS)
    ]
    assert all("HTTP 500 from receiver" in r.text for r in rows)
    assert driver.find_element(By.ID, "dead-count").text == "3 dead in the topic"

    box = driver.find_element(By.CSS_SELECTOR, '#dead-table input[data-id="dl-b"]')
    box.send_keys(Keys.SPACE)  # keyboard selection
    assert box.is_selected()
    driver.find_element(By.ID, "dead-redrive-selected").click()
    confirm(driver)
    status_text(driver, "dead-status", "Redrive: 1 of 1")
    slot = served.api("GET", "/messages/dl-b")["slot"]
    assert store.zscore(key(slot, Part.DEAD), "dl-b") is None
    assert store.zscore(key(slot, Part.STORE), "dl-b") is not None
    assert dead_total(store) == 2

    driver.find_element(By.ID, "dead-purge-all").click()
    confirm(driver)
    status_text(driver, "dead-status", "Purge: 2 message(s)")
    assert dead_total(store) == 0
    assert driver.find_elements(By.CSS_SELECTOR, "#dead-table tbody tr") == []
    assert console_errors(driver) == []


def test_a_dead_message_scheduled_with_a_slot_basis_is_redriven_from_the_list(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    """Its id alone routes elsewhere (the record does not keep the basis): the page sends the
    slot it lists, and the message moves from that slot's dead set to its store."""
    topic = Topic(TOPIC, namespace=NAMESPACE, slot_amount=SLOTS)
    basis = next(
        f"customer-{n}"
        for n in range(100)
        if Target("dl-basis", f"customer-{n}").slot(topic) != topic.slot_of("dl-basis")
    )
    slot = served.schedule("dl-basis", 0, slotBasis=basis)["slot"]
    served.kill_to_dead(1, "HTTP 503 from receiver", including="dl-basis")
    assert store.zscore(key(slot, Part.DEAD), "dl-basis") is not None
    open_dashboard(driver, served.url, page="dead")
    driver.find_element(By.CSS_SELECTOR, '#dead-table input[data-id="dl-basis"]').click()
    driver.find_element(By.ID, "dead-redrive-selected").click()
    confirm(driver)
    status_text(driver, "dead-status", "Redrive: 1 of 1")
    assert store.zscore(key(slot, Part.DEAD), "dl-basis") is None
    assert store.zscore(key(slot, Part.STORE), "dl-basis") is not None
    served.api("DELETE", f"/messages/dl-basis?slotBasis={basis}")  # due now: would stall
    served.api("POST", "/dead/purge", {"all": True})  # what kill_to_dead took beside it
    assert console_errors(driver) == []


def test_a_dead_message_scheduled_with_a_slot_basis_opens_from_the_list_and_is_redriven(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    """Its id alone would look in another slot and find nothing: the list links to the message
    page with the slot it lists, and the page's redrive addresses that slot too."""
    topic = Topic(TOPIC, namespace=NAMESPACE, slot_amount=SLOTS)
    basis = next(
        f"tenant-{n}"
        for n in range(100)
        if Target("dl-open", f"tenant-{n}").slot(topic) != topic.slot_of("dl-open")
    )
    slot = served.schedule("dl-open", 0, slotBasis=basis, payload="order 9")["slot"]
    served.kill_to_dead(1, "HTTP 410 from receiver", including="dl-open")
    open_dashboard(driver, served.url, page="dead")
    link = driver.find_element(By.XPATH, '//*[@id="dead-table"]//a[text()="dl-open"]')
    assert link.get_attribute("href") == f"{served.url}/ui{message_hash('dl-open', slot)}"
    before = loads(driver, "message")
    link.click()
    wait_for_load(driver, "message", before + 1)
    fields = definitions(driver, "message-fields")
    assert (fields["Id"], fields["State"], fields["Slot"]) == ("dl-open", "dead", str(slot))
    assert fields["Last error"] == "HTTP 410 from receiver"
    assert driver.find_element(By.ID, "message-payload").text == "order 9"
    assert driver.find_element(By.ID, "lookup-slot").get_attribute("value") == str(slot)

    driver.find_element(By.ID, "redrive-button").click()
    confirm(driver)
    status_text(driver, "message-status", "redriven")
    assert definitions(driver, "message-fields")["State"] == "scheduled"
    assert store.zscore(key(slot, Part.DEAD), "dl-open") is None
    assert store.zscore(key(slot, Part.STORE), "dl-open") is not None
    served.api("DELETE", f"/messages/dl-open?slot={slot}")  # due now: would stall
    served.api("POST", "/dead/purge", {"all": True})  # what kill_to_dead took beside it
    assert [error["message"] for error in console_errors(driver)] == []


def delivery_state(driver: webdriver.Chrome, contains: str) -> str:
    return status_text(driver, "delivery-state", contains)


def test_pause_and_resume_from_the_overview_say_so_in_words(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    open_dashboard(driver, served.url)
    delivery_state(driver, "running")
    assert not driver.find_element(By.ID, "pause-button").get_attribute("hidden")
    assert driver.find_element(By.ID, "resume-button").get_attribute("hidden") is not None
    try:
        driver.find_element(By.ID, "pause-button").click()
        confirm(driver)
        assert "nothing is claimed" in delivery_state(driver, "⏸ paused")
        assert store.exists(PAUSED_KEY)
        wait_until(  # the other process's overview too (its view is at most a second old)
            lambda: served.api("GET", "/overview", process=1)["paused"], WAIT_S, "web-1 paused"
        )
        assert driver.find_element(By.ID, "pause-button").get_attribute("hidden") is not None
        driver.find_element(By.ID, "resume-button").click()
        confirm(driver)
        delivery_state(driver, "running")
        assert not store.exists(PAUSED_KEY)
    finally:
        store.delete(PAUSED_KEY)  # never leave the shared fleet paused for the next tests
    assert console_errors(driver) == []


XSS_ID = '<img src=x onerror="window.__xss=1">'
XSS_PAYLOAD = "<script>window.__xss=2</script><b>bold</b>"
XSS_HEADER = ('<i onmouseover="window.__xss=3">h</i>', '"><svg onload="window.__xss=4">')
XSS_REASON = "<iframe src=javascript:window.__xss=5></iframe>"


def test_xss_attempts_in_ids_payloads_headers_and_reasons_render_inert(
    served: Fleet, driver: webdriver.Chrome
):
    served.api("POST", "/dead/purge", {"all": True})
    served.schedule(XSS_ID, 120_000, payload=XSS_PAYLOAD, headers=dict([XSS_HEADER]))
    served.schedule("xss-dead", 0, payload=XSS_PAYLOAD)
    served.kill_to_dead(1, XSS_REASON, including="xss-dead")
    open_dashboard(driver, served.url, page="dead")
    # an earlier test's message may have gone to dead beside ours: pick ours
    dead_row = next(
        row
        for row in driver.find_elements(By.CSS_SELECTOR, "#dead-table tbody tr")
        if "xss-dead" in row.text
    )
    assert XSS_REASON in dead_row.text
    assert XSS_PAYLOAD[:40] in dead_row.text

    before = loads(driver, "message")
    driver.get(f"{served.url}/ui{message_hash(XSS_ID)}")
    wait_for_load(driver, "message", before + 1)
    assert definitions(driver, "message-fields")["Id"] == XSS_ID
    assert driver.find_element(By.ID, "message-payload").text == XSS_PAYLOAD
    header_cells = driver.find_elements(By.CSS_SELECTOR, "#message-headers td")
    assert [c.text for c in header_cells] == list(XSS_HEADER)

    injected = "main img, main script, main iframe, main b, main i, #message-result svg"
    assert driver.find_elements(By.CSS_SELECTOR, injected) == []
    assert driver.execute_script("return window.__xss") is None
    assert console_errors(driver) == []  # a blocked inline script would log a CSP violation


def test_read_only_token_looks_but_cannot_act(
    served: Fleet, driver: webdriver.Chrome, store: redis.Redis
):
    scheduled = served.schedule("keep-me", 60_000)
    open_dashboard(driver, served.url, token=READ_TOKEN)
    assert definitions(driver, "depth")["Waiting (not yet due)"] != ""
    before = loads(driver, "message")
    driver.get(f"{served.url}/ui{message_hash('keep-me')}")
    wait_for_load(driver, "message", before + 1)
    driver.find_element(By.ID, "cancel-button").click()
    confirm(driver)
    assert "read-only token" in status_text(driver, "error", "read-only")
    assert store.zscore(key(scheduled["slot"], Part.STORE), "keep-me") is not None
    driver.get(f"{served.url}/ui#/overview")
    delivery_state(driver, "running")
    WebDriverWait(driver, WAIT_S).until(
        lambda d: not d.find_element(By.ID, "error").is_displayed(), "the cancel's error gone"
    )
    driver.find_element(By.ID, "pause-button").click()
    confirm(driver)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: (
            "read-only" in d.find_element(By.ID, "error").text
            and "running" in d.find_element(By.ID, "delivery-state").text
        ),
        "the pause refused",
    )
    assert not store.exists(PAUSED_KEY)
    errors = console_errors(driver)
    assert [e for e in errors if "403" not in e["message"]] == []  # the refused writes only


def test_every_control_has_a_name_for_assistive_technology(served: Fleet, driver):
    """Keyboard and screen-reader users need a label on every control."""
    open_dashboard(driver, served.url)
    unnamed = driver.execute_script(
        """
        return [...document.querySelectorAll('input, select, button, a[href]')].filter((el) => {
          const label = el.labels && el.labels.length > 0;
          const text = (el.textContent || '').trim() !== '';
          return !label && !text && !el.getAttribute('aria-label');
        }).map((el) => el.outerHTML);
        """
    )
    assert unnamed == []


def test_the_schedules_page_lists_recurring_schedules(served: Fleet, driver: webdriver.Chrome):
    """What `GET /schedules` answers, as a person reads it: recurrence in words, when each
    fires next, catch-up; an id written as markup stays text."""
    cron = {"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin", "payload": "standup"}
    served.api("PUT", "/schedules/standup", cron)
    every = {"everyMs": 3_600_000, "startMs": 2_208_988_800_000, "payload": "tick"}
    served.api("PUT", f"/schedules/{quote(XSS_ID, safe='')}", every)
    try:
        open_dashboard(driver, served.url, page="schedules")
        rows = {
            row.find_element(By.CSS_SELECTOR, "td").text: row.text
            for row in driver.find_elements(By.CSS_SELECTOR, "#schedules-table tbody tr")
        }
        assert "cron 0 9 * * 1-5 (Europe/Berlin)" in rows["standup"]
        assert "every 1 h" in rows[XSS_ID]
        assert "2040-01-01" in rows[XSS_ID]  # its waiting occurrence, due at startMs
        assert driver.find_elements(By.CSS_SELECTOR, "main img, main script") == []
        assert driver.execute_script("return window.__xss") is None
        assert console_errors(driver) == []
    finally:
        served.api("DELETE", "/schedules/standup")
        served.api("DELETE", f"/schedules/{quote(XSS_ID, safe='')}")
