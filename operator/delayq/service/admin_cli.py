"""Admin commands over a delay service's HTTP API: `delayq topic stats|pause|resume`, `delayq
msg get|cancel|reschedule`, `delayq dead list|redrive|purge` and `delayq slots`.

They answer "why didn't my message fire?" without hand-written curl calls, and behave the same
against a laptop's `delayq dev` and a cluster's Service: `--url` (or `DELAYQ_URL`) names any
process of the topic, the token comes from `DELAYQ_API_TOKEN` (never a flag: flags end up in
shell history and `ps`). Tables for people by default, `--json` for scripts (the API's own
answer), and exit codes scripts can rely on (EXIT_CODES). Only the standard library: the
commands must start fast and work wherever `delayq` is installed.

Text that came from the service (ids, payloads, reasons) is printed with control characters
escaped, so a message cannot rewrite the operator's terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import quote, urlencode, urlsplit

OK, NOT_FOUND, BAD_INPUT, UNREACHABLE, CONFLICT = 0, 1, 2, 3, 4
EXIT_CODES = {
    OK: "done",
    NOT_FOUND: "not found (the message, or one of the listed ids)",
    BAD_INPUT: "usage error or input the service refused (400, 413)",
    UNREACHABLE: "service unreachable, token refused (401, 403), or unavailable (429, 5xx)",
    CONFLICT: "conflict: the message is not in a state that allows it (409)",
}
TOKEN_VARIABLE = "DELAYQ_API_TOKEN"
URL_VARIABLE = "DELAYQ_URL"
TOPIC_VARIABLE = "DELAYQ_TOPIC"
DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0
PREVIEW_CHARS = 200  # payload characters `msg get` prints (the whole payload: --json)
IDS_PER_CALL = 1000  # the API's batch limit (parsing.MAX_BATCH)
PROGRESS_INTERVAL_S = 0.5


class AdminError(Exception):
    """A command failed; `code` is its exit code, the text its one line on stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_code(status: int) -> int:
    """The exit code of an HTTP error status."""
    if status == 404:
        return NOT_FOUND
    if status == 409:
        return CONFLICT
    if status in (400, 405, 408, 413):
        return BAD_INPUT
    return UNREACHABLE


@dataclass(frozen=True)
class Api:
    """The topic routes of one delay service, with the token from the environment."""

    url: str
    topic: str
    token: str
    timeout_s: float = TIMEOUT_S

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        answered: frozenset[int] = frozenset(),
    ) -> Any:
        """The JSON answer of `method /v1/topics/<topic><path>`; AdminError otherwise. A status
        in `answered` whose body is not an error is an answer too (a dead action's 404 lists
        what it did to each id)."""
        target = f"{self.url}/v1/topics/{quote(self.topic, safe='')}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(target, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as error:
            if error.code in answered:
                raw = error.read()
                with contextlib.suppress(ValueError):
                    if "error" not in (given := json.loads(raw)):
                        return given
                error.fp = io.BytesIO(raw)  # read again for the error's text
            raise AdminError(status_code(error.code), _error_text(error)) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise AdminError(UNREACHABLE, f"{self.url} unreachable: {reason}") from None
        except http.client.HTTPException as error:  # cut short: IncompleteRead, BadStatusLine
            raise AdminError(UNREACHABLE, f"{self.url} broke off its answer: {error!r}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminError(UNREACHABLE, f"{self.url} did not answer JSON") from None


def _error_text(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read())
        text = str(body["error"])
        field = body.get("field")
    except (ValueError, KeyError, TypeError, OSError):
        text, field = error.reason, None
    # the service's own words for a query parameter, as this command's option
    text = text.replace("?slotBasis=", "--slot-basis").replace("?slot=", "--slot")
    hint = ""
    if error.code == 401:
        hint = f" (set {TOKEN_VARIABLE})"
    where = f" [{field}]" if field else ""
    return f"HTTP {error.code}{where}: {text}{hint}"


# ---- output ----------------------------------------------------------------------------------


def safe(value: Any) -> str:
    """Text from the service, printable: control characters as escapes, so a payload or id
    cannot move the cursor, recolour or retitle the terminal."""
    text = "" if value is None else str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO) -> None:
    cells = [[safe(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def pairs(rows: Sequence[tuple[str, Any]], out: TextIO) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {safe(value)}", file=out)


def instant(ms: int | None, now_ms: float | None = None) -> str:
    if ms is None:
        return "-"
    text = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    if now_ms is None:
        return text
    delta = ms - now_ms
    return f"{text} ({'in ' + duration(delta) if delta >= 0 else duration(-delta) + ' ago'})"


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = int(ms // 1000)
    parts: list[str] = []
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= unit and len(parts) < 2:
            parts.append(f"{seconds // unit} {name}")
            seconds %= unit
    return " ".join(parts)


def emit_json(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=2, sort_keys=True)  # ensure_ascii: control characters escaped
    print(file=out)


def answer(value: Any, as_json: bool, text: str, out: TextIO) -> None:
    """An action's outcome: the API's answer for scripts (`--json`), else `text` for people
    (service text in it already passed through `safe`)."""
    if as_json:
        emit_json(value, out)
    else:
        print(text, file=out)


# ---- commands --------------------------------------------------------------------------------


def topic_stats(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    overview = api.call("GET", "/overview")
    if args.json:
        emit_json(overview, out)
        return OK
    depth, fleet, histogram = overview["depth"], overview["fleet"], overview["dueHistogram"]
    now = overview["nowMs"]
    pairs(
        [
            ("topic", f"{overview['namespace']}/{overview['topic']} ({overview['topicType']})"),
            ("waiting (not yet due)", depth["scheduled"] - depth["due"]),
            ("due, not claimed", depth["due"]),
            ("in flight (leased)", depth["prepared"]),
            ("dead", depth["dead"]),
            ("delivery", _delivery(overview["pausedBrokers"], overview["brokers"])),
            ("next due", instant(overview["nextDueMs"], now)),
            ("oldest overdue", duration(overview["oldestOverdueMs"] or None)),
            ("due in next minute", histogram["nextMinute"]),
            ("due in next hour", histogram["nextHour"]),
            ("due in next day", histogram["nextDay"]),
            ("due later", histogram["later"]),
            *_fleet_rows(fleet, overview["slotAmount"]),
            ("stalled slots", _listed(fleet["stalledSlots"], fleet.get("stalled", []))),
        ],
        out,
    )
    return OK


def _delivery(paused_brokers: list[int], brokers: int) -> str:
    if not paused_brokers:
        return "running"
    if len(paused_brokers) < brokers:
        return f"PAUSED on broker(s) {', '.join(map(str, paused_brokers))} of {brokers}"
    return "PAUSED (nothing is claimed; scheduling goes on)"


def topic_pause(paused: bool) -> Callable[[Api, argparse.Namespace, TextIO], int]:
    """`topic pause` or `topic resume`: every process of the topic follows within a second."""

    def run(api: Api, args: argparse.Namespace, out: TextIO) -> int:
        done = api.call("POST", "/pause" if paused else "/resume")
        state = "paused" if paused else "resumed"
        answer(done, args.json, f"{safe(api.topic)}: delivery {state}", out)
        return OK

    return run


def _fleet_rows(fleet: dict[str, Any], slot_amount: int) -> list[tuple[str, Any]]:
    if fleet.get("error"):
        return [("ownership", f"unknown ({fleet['error']})")]
    return [
        ("processes", ", ".join(fleet["members"]) or "none"),
        ("slots held", f"{fleet['heldSlots']} of {slot_amount}"),
        ("unowned slots", _listed(fleet["unownedSlots"], fleet.get("unowned", []))),
    ]


def _listed(count: int, slots: list[int]) -> str:
    if not count:
        return "none"
    more = ", ..." if count > len(slots) else ""
    return f"{count}: {', '.join(str(s) for s in slots)}{more}"


def _message_path(args: argparse.Namespace, suffix: str = "") -> str:
    """The message's path, with the `--slot` that holds it (as `dead list` shows it) or the
    `--slot-basis` it was scheduled with (at most one: `_message` makes them exclusive)."""
    if not args.id:
        raise AdminError(BAD_INPUT, "a message id cannot be empty")
    if args.slot is not None:
        query = "?" + urlencode({"slot": args.slot})
    else:
        query = "?" + urlencode({"slotBasis": args.slot_basis}) if args.slot_basis else ""
    return f"/messages/{quote(args.id, safe='')}{suffix}{query}"


def msg_get(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    message = api.call("GET", _message_path(args))
    if args.json:
        emit_json(message, out)
        return OK
    now = time.time() * 1000
    payload = message.get("payload", "")
    preview = payload[:PREVIEW_CHARS] + (" ..." if len(payload) > PREVIEW_CHARS else "")
    if "finishedMs" in message:  # a remembered outcome keeps no payload, headers nor due
        preview, payload = "- (not kept once finished)", None
    rows: list[tuple[str, Any]] = [
        ("id", message["id"]),
        ("state", message["state"]),
        ("slot", message["slot"]),
        ("due", instant(message.get("dueMs"), now)),
        ("attempts", message["attempts"]),
        ("priority", message.get("priority", 0)),
        ("group", message.get("group", "-")),
        ("lease deadline", instant(message.get("leaseDeadlineMs"), now)),
        ("died", instant(message.get("diedMs"), now)),
        ("finished", instant(message.get("finishedMs"), now)),
        ("last error", message.get("deadReason", "-")),
        ("encoding", message["encoding"]),
        ("payload", preview if payload is None else f"{preview} ({len(payload)} characters)"),
    ]
    rows += [(f"header {name}", value) for name, value in message.get("headers", {}).items()]
    pairs(rows, out)
    return OK


def msg_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    done = api.call("DELETE", _message_path(args))
    answer(done, args.json, f"{safe(done['id'])}: {done['result']}", out)
    return OK


def msg_reschedule(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    body = {"delayMs": args.delay_ms} if args.delay_ms is not None else {"atMs": args.at_ms}
    done = api.call("POST", _message_path(args, "/reschedule"), body)
    text = f"{safe(done['id'])}: {done['result']}, due {instant(done['dueMs'])}"
    answer(done, args.json, text, out)
    return OK


def _schedule_path(args: argparse.Namespace) -> str:
    if not args.id:
        raise AdminError(BAD_INPUT, "a schedule id cannot be empty")
    return f"/schedules/{quote(args.id, safe='')}"


def _recurrence(schedule: dict[str, Any]) -> str:
    """`cron <expr> (<zone>)` or `every <duration>`, as the schedule was put."""
    if "cron" in schedule:
        return f"cron {schedule['cron']} ({schedule['timeZone']})"
    return f"every {duration(schedule['everyMs'])}"


def _fires_next(schedule: dict[str, Any]) -> int | None:
    """When the schedule fires next: its waiting occurrence, else the precomputed next one."""
    current: int | None = schedule.get("currentDueMs")
    return current if current is not None else schedule.get("nextDueMs")


def schedules_list(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    found = api.call("GET", "/schedules")
    if args.json:
        emit_json(found, out)
        return OK
    now = time.time() * 1000
    rows = [
        (
            s["id"],
            _recurrence(s),
            "ended" if s["ended"] else instant(_fires_next(s), now),
            s["catchUp"],
            s["slot"],
        )
        for s in found["schedules"]
    ]
    table(rows, ("ID", "RECURRENCE", "NEXT", "CATCH-UP", "SLOT"), out)
    return OK


def schedules_get(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    schedule = api.call("GET", _schedule_path(args))
    if args.json:
        emit_json(schedule, out)
        return OK
    now = time.time() * 1000
    pairs(
        [
            ("id", schedule["id"]),
            ("recurrence", _recurrence(schedule)),
            ("start", instant(schedule.get("startMs"), now)),
            ("end", instant(schedule.get("endMs"), now)),
            ("catch-up", f"{schedule['catchUp']} (at most {schedule['catchUpMax']})"),
            ("priority", schedule.get("priority", 0)),
            ("group", schedule.get("group", "-")),
            ("waiting occurrence", schedule.get("currentId") or "-"),
            ("its due time", instant(schedule.get("currentDueMs"), now)),
            ("then", "ended" if schedule["ended"] else instant(schedule.get("nextDueMs"), now)),
            ("slot", schedule["slot"]),
        ],
        out,
    )
    return OK


def schedules_delete(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    done = api.call("DELETE", _schedule_path(args))
    answer(done, args.json, f"{safe(done['id'])}: {done['result']}", out)
    return OK


def dead_list(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    query = {"count": str(args.count)}
    if args.cursor:
        query["cursor"] = args.cursor
    page = api.call("GET", f"/dead?{urlencode(query)}")
    if args.json:
        emit_json(page, out)
        return OK
    now = time.time() * 1000
    rows = [
        (
            m["id"],
            m["slot"],
            m["attempts"],
            m.get("priority", 0),
            m.get("group", "-"),
            instant(m.get("diedMs"), now),
            (m.get("deadReason") or "-")[:80],
        )
        for m in page["messages"]
    ]
    table(rows, ("ID", "SLOT", "ATTEMPTS", "PRIORITY", "GROUP", "DIED", "REASON"), out)
    if page["nextCursor"] is not None:
        print(f"more: --cursor {page['nextCursor']}", file=sys.stderr)
    return OK


class Progress:
    """A progress line on stderr, redrawn in place; silent unless asked for or on a terminal
    (a script's log must not fill with carriage returns)."""

    def __init__(self, verb: str, total: int, enabled: bool, err: TextIO) -> None:
        self.verb, self.total, self.enabled, self.err = verb, total, enabled, err
        self.last = -1

    def show(self, done: int) -> None:
        if not self.enabled or done == self.last:
            return
        self.last = done
        total = max(self.total, done, 1)
        width = 30
        filled = int(width * done / total)
        bar = "#" * filled + "-" * (width - filled)
        self.err.write(f"\r{self.verb} [{bar}] {done}/{total}")
        self.err.flush()

    def finish(self) -> None:
        if self.enabled and self.last >= 0:
            self.err.write("\n")
            self.err.flush()


@dataclass(frozen=True)
class DeadAction:
    """`dead redrive` or `dead purge`: what differs between the two commands is the route
    (also the command's name), the word its per-message result says when done, and the help."""

    route: str  # /dead/<route>
    done: str  # the result of a message it was done to
    help: str

    def __call__(self, api: Api, args: argparse.Namespace, out: TextIO) -> int:
        """Listed ids (batches of IDS_PER_CALL), or `--all` in one call."""
        if bool(args.ids) == args.all:
            raise AdminError(BAD_INPUT, "give dead message ids or --all, not both or neither")
        if args.all and (args.slot is not None or args.slot_basis is not None):
            raise AdminError(BAD_INPUT, "--slot and --slot-basis go with listed ids, not --all")
        if args.all and self.route == "purge" and not args.yes:
            raise AdminError(BAD_INPUT, "purge --all deletes every dead message: add --yes")
        progress_shown = args.progress or sys.stderr.isatty()
        if args.all:
            moved = self._all(api, progress_shown)
            answer(moved, args.json, f"{moved['moved']} {self.done}", out)
            return OK
        targets = _dead_targets(args)
        progress = Progress(self.done, len(targets), progress_shown, sys.stderr)
        results: list[dict[str, Any]] = []
        for start in range(0, len(targets), IDS_PER_CALL):
            chunk = targets[start : start + IDS_PER_CALL]
            body = {"ids": chunk}
            answered = frozenset({404})  # some id was not dead: still each id's result
            results += api.call("POST", f"/dead/{self.route}", body, answered=answered)["results"]
            progress.show(len(results))
        progress.finish()
        missing = [r for r in results if r["result"] != self.done]
        summary = f"{len(results) - len(missing)} of {len(results)} {self.done}"
        lines = [summary, *(f"{safe(r['id'])}: {r['result']}" for r in missing)]
        answer({"results": results}, args.json, "\n".join(lines), out)
        return NOT_FOUND if missing else OK

    def _all(self, api: Api, progress_shown: bool) -> dict[str, Any]:
        """One `{"all": true}` call (the service drains slot by slot); while it runs, the dead
        count read from /stats drives the progress bar."""
        total = int(api.call("GET", "/stats")["dead"])
        progress = Progress(self.done, total, progress_shown, sys.stderr)
        moved: dict[str, Any] = {}
        failure: list[AdminError] = []

        def request() -> None:
            try:
                body = {"all": True}
                moved.update(api.call("POST", f"/dead/{self.route}", body, timeout_s=3600))
            except AdminError as error:
                failure.append(error)

        worker = threading.Thread(target=request, daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(PROGRESS_INTERVAL_S)
            if worker.is_alive() and progress.enabled:
                # the count only drives the bar; the action's own answer decides the outcome
                with contextlib.suppress(AdminError):
                    dead = int(api.call("GET", "/stats")["dead"])
                    progress.show(max(0, total - dead))
        if failure:
            progress.finish()
            raise failure[0]
        progress.show(int(moved["moved"]))
        progress.finish()
        return moved


DEAD_ACTIONS = (
    DeadAction("redrive", "redriven", "schedule dead messages again (delivered now)"),
    DeadAction("purge", "purged", "delete dead messages for good"),
)


def _dead_targets(args: argparse.Namespace) -> list[Any]:
    """The listed ids as the API takes them: with the `--slot` that `dead list` shows, or the
    `--slot-basis` they were scheduled with (their ids alone would route elsewhere)."""
    if args.slot is not None:
        return [{"id": message_id, "slot": args.slot} for message_id in args.ids]
    if args.slot_basis is not None:
        return [{"id": message_id, "slotBasis": args.slot_basis} for message_id in args.ids]
    return list(args.ids)


def slots(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    query = {"start": str(args.start), "count": str(args.count), "only": args.only}
    page = api.call("GET", f"/slots?{urlencode(query)}")
    if args.json:
        emit_json(page, out)
        return OK
    rows = []
    for s in page["slots"]:
        status = "UNOWNED" if not s["held"] else "STALLED" if s["stalled"] else "ok"
        status = "PAUSED" if status == "ok" and s["paused"] else status
        owner = s["owner"] or (f"none (assigned {s['assigned']})" if s["assigned"] else "none")
        rows.append(
            (
                s["slot"],
                status,
                owner,
                s["epoch"] if s["epoch"] is not None else "-",
                s["broker"],
                s["scheduled"],
                s["due"],
                s["prepared"],
                s["dead"],
                duration(s["oldestOverdueMs"]) if s["oldestOverdueMs"] else "-",
            )
        )
    header = ("SLOT", "STATUS", "OWNER", "EPOCH", "BROKER", "SCHEDULED", "DUE", "IN-FLIGHT")
    table(rows, (*header, "DEAD", "OLDEST-OVERDUE"), out)
    if page["nextStart"] is not None:
        print(f"more: --start {page['nextStart']}", file=sys.stderr)
    return OK


# ---- parsing ---------------------------------------------------------------------------------


def non_negative(text: str) -> int:
    """argparse type of the CLI's counts and slot numbers (also `delayq routing`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def positive(text: str) -> int:
    """argparse type of a count that must be at least 1 (also `delayq pipeline`)."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    """argparse type of `--timeout`: a finite number of seconds above 0 (the socket refuses a
    negative or NaN one with a traceback, and 0 would make every call fail as unreachable)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_VARIABLE, DEFAULT_URL),
        help=f"any delay service of the topic (env {URL_VARIABLE}; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--topic",
        default=os.environ.get(TOPIC_VARIABLE, ""),
        help=f"the topic (env {TOPIC_VARIABLE})",
    )
    parser.add_argument("--json", action="store_true", help="the API's JSON answer, for scripts")
    parser.add_argument(
        "--timeout", type=_seconds, default=TIMEOUT_S, help="seconds per request (default 30)"
    )


def _message(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="message id (as scheduled; any characters)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--slot-basis", help="the slot basis it was scheduled with, if any")
    where.add_argument(
        "--slot", type=non_negative, help="instead, the slot that holds it (as `dead list` shows)"
    )


EPILOG = (
    f"The token comes from ${TOKEN_VARIABLE}. Exit codes: "
    + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items())
    + "."
)


def register(subparsers: Any) -> None:
    """Add `topic`, `msg`, `dead`, `schedules` and `slots` to the `delayq` command."""

    def leaf(group: Any, name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(
            name, help=help_text, description=help_text, epilog=EPILOG
        )
        _common(parser)
        parser.set_defaults(handler=handler(run))
        return parser

    def group(name: str, help_text: str) -> Any:
        parser = subparsers.add_parser(name, help=help_text, description=help_text, epilog=EPILOG)
        return parser.add_subparsers(dest=f"{name}_command", required=True)

    topic = group("topic", "a topic's state over its delay service's HTTP API")
    leaf(
        topic,
        "stats",
        "depths, paused or not, due-time histogram, next due, slots held and stalled",
        topic_stats,
    )
    leaf(
        topic,
        "pause",
        "stop delivering (nothing is claimed; scheduling goes on)",
        topic_pause(True),
    )
    leaf(topic, "resume", "deliver again (the backlog of due messages drains)", topic_pause(False))

    msg = group("msg", "one message by id: look it up, cancel or reschedule it")
    _message(leaf(msg, "get", "state, due time, attempts, last error, headers, payload", msg_get))
    _message(leaf(msg, "cancel", "cancel a scheduled message", msg_cancel))
    reschedule = leaf(msg, "reschedule", "move a message's due time", msg_reschedule)
    _message(reschedule)
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay-ms", type=non_negative, help="due this long from now")
    when.add_argument("--at-ms", type=non_negative, help="due at this Unix time (ms)")

    dead = group("dead", "the dead letters: list, redrive, purge")
    listing = leaf(dead, "list", "one page of dead messages with reason and attempts", dead_list)
    listing.add_argument("--count", type=positive, default=100, help="page size (max 1000)")
    listing.add_argument("--cursor", help="continue from a previous page's cursor")
    for action in DEAD_ACTIONS:
        parser = leaf(dead, action.route, action.help, action)
        parser.add_argument("ids", nargs="*", help="dead message ids")
        parser.add_argument("--all", action="store_true", help="every dead message of the topic")
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--slot", type=non_negative, help="the ids' slot, as `dead list` shows it"
        )
        where.add_argument("--slot-basis", help="the slot basis the ids were scheduled with")
        parser.add_argument("--yes", action="store_true", help="purge --all: yes, really")
        parser.add_argument(
            "--progress", action="store_true", help="progress bar even when not on a terminal"
        )

    schedules = group("schedules", "the topic's recurring schedules: list, look up, delete")
    leaf(schedules, "list", "every schedule with its recurrence and next due time", schedules_list)
    leaf(
        schedules,
        "get",
        "one schedule: recurrence, window, catch-up, waiting occurrence",
        schedules_get,
    ).add_argument("id", help="the schedule id")
    leaf(
        schedules,
        "delete",
        "delete a schedule and its waiting occurrence (removed, not remembered)",
        schedules_delete,
    ).add_argument("id", help="the schedule id")

    slot_map = leaf(
        subparsers, "slots", "the slot map: owner, epoch, depth, oldest overdue per slot", slots
    )
    slot_map.add_argument("--start", type=non_negative, default=0, help="first slot")
    slot_map.add_argument("--count", type=positive, default=1024, help="slots (max 1024)")
    slot_map.add_argument(
        "--only", choices=("all", "attention"), default="all", help="attention: stalled, unowned"
    )


def handler(run: Callable[[Api, argparse.Namespace, TextIO], int]) -> Any:
    """The parsed arguments → the command, with every failure one line on stderr."""

    def handle(args: argparse.Namespace) -> int:
        name = _command_name(args)
        try:
            api = Api(_checked_url(args.url), _checked_topic(args.topic), _token(), args.timeout)
            return run(api, args, sys.stdout)
        except AdminError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return error.code
        except KeyboardInterrupt:
            print(f"{name}: interrupted", file=sys.stderr)
            return UNREACHABLE

    return handle


def _command_name(args: argparse.Namespace) -> str:
    words = ["delayq", args.command]
    words += [str(v) for k, v in vars(args).items() if k.endswith("_command") and v]
    return " ".join(words)


def _checked_url(url: str) -> str:
    """The URL, or BAD_INPUT naming it: a port that is not a number or a broken IPv6 address
    would otherwise surface as a traceback from urllib, on the first call."""
    try:
        parts = urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number or out of range, a broken IPv6 address
        usable = False
    if not usable:
        raise AdminError(BAD_INPUT, f"--url must be http(s)://host:port, not {url!r}")
    return url.rstrip("/")


def _checked_topic(topic: str) -> str:
    if not topic:
        raise AdminError(BAD_INPUT, f"name the topic: --topic or {TOPIC_VARIABLE}")
    return topic


def _token() -> str:
    return os.environ.get(TOKEN_VARIABLE, "")
