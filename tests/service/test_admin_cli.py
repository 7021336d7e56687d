"""The admin commands (`delayq topic stats|pause|resume`, `msg`, `dead`, `slots`) against a
real `delayq serve` process on the session's real redis-server: tables, `--json`, exit codes,
one-line errors, and that the actions change what Redis holds."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from delayq.cli import main
from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import Target, Topic
from delayq.queue.keys import Part, SlotKeys, paused_key
from delayq.queue.topic import TopicType
from delayq.service.admin_cli import BAD_INPUT, NOT_FOUND, OK, UNREACHABLE
from delayq.service.config import ServiceConfig

NAMESPACE, TOPIC, TOKEN, SLOTS = "ops", "admin", "admin-token", 8


@dataclasses.dataclass
class Served:
    process: ServeProcess
    redis: redis.Redis

    @property
    def url(self) -> str:
        return self.process.url

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/topics/{TOPIC}{path}", data=data, method=method
        )
        request.add_header("Authorization", f"Bearer {TOKEN}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def key(self, slot: int, part: Part) -> str:
        return SlotKeys(NAMESPACE, TOPIC, slot).key(part)

    def to_dead(self, ids: list[str], **extra: str | int) -> None:
        """Schedule `ids` due now and nack them straight to dead; leases until every one of
        them was leased (an earlier test's due message may come first: it dies too)."""
        for message_id in ids:
            message = {"id": message_id, "delayMs": 0, "payload": "p", **extra}
            self.api("POST", "/messages", message)
        killed: set[str] = set()

        def lease_and_kill() -> bool:
            leased = self.api("POST", "/leases", {"max": 100})["leases"]
            if leased:
                tokens = [lease["token"] for lease in leased]
                self.api("POST", "/leases/nack", {"tokens": tokens, "dead": True, "reason": "boom"})
                killed.update(lease["id"] for lease in leased)
            return killed >= set(ids)

        wait_until(lease_and_kill, 10, "the messages sent to dead", interval_s=0.05)


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = ServiceConfig(
        redis_url=redis_server.url,
        namespace=NAMESPACE,
        topic=TOPIC,
        slot_amount=SLOTS,
        topic_type=TopicType.PULL,
        api_token=TOKEN,
        port=free_port(),
        grace_ms=2000,
        outcome_retention_ms=3_600_000,
    )
    log = tmp_path_factory.mktemp("admin") / "serve.log"
    process = ServeProcess(config, log).start()
    client = redis.Redis.from_url(redis_server.url)

    def ready() -> bool:
        assert process.running(), log.read_text()
        try:
            with urllib.request.urlopen(process.url + "/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, 30, "delayq serve ready", interval_s=0.05)
        yield Served(process, client)
    finally:
        process.terminate()
        process.wait()
        client.close()


@pytest.fixture
def run(served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`delayq <argv>` in this process against the served topic: (exit code, stdout, stderr)."""
    monkeypatch.setenv("DELAYQ_API_TOKEN", TOKEN)
    monkeypatch.setenv("DELAYQ_URL", served.url)
    monkeypatch.setenv("DELAYQ_TOPIC", TOPIC)

    def invoke(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def test_topic_stats_table_and_json_match_the_api(served: Served, run):
    served.api("POST", "/messages", {"id": "stats-1", "delayMs": 30_000})
    served.api("POST", "/messages", {"id": "stats-2", "delayMs": 7_200_000})
    code, out, err = run("topic", "stats", "--json")
    assert (code, err) == (OK, "")
    overview = json.loads(out)
    api = served.api("GET", "/overview")
    assert overview["depth"] == api["depth"]
    assert overview["dueHistogram"] == api["dueHistogram"]
    code, out, _ = run("topic", "stats")
    assert code == OK
    lines = dict(line.split("  ", 1) for line in out.splitlines())
    assert lines["due in next minute"].strip() == str(api["dueHistogram"]["nextMinute"])
    assert lines["slots held"].strip() == f"{SLOTS} of {SLOTS}"


def test_msg_get_reschedule_cancel_change_redis(served: Served, run):
    message = {"id": "m/1", "delayMs": 60_000, "payload": "hi", "priority": 3, "group": "acme"}
    scheduled = served.api("POST", "/messages", message)
    store = served.key(scheduled["slot"], Part.STORE)
    code, out, _ = run("msg", "get", "m/1")
    assert code == OK
    assert "scheduled" in out
    assert "hi (2 characters)" in out
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert (rows["priority"].strip(), rows["group"].strip()) == ("3", "acme")
    code, out, _ = run("msg", "get", "m/1", "--json")
    assert json.loads(out) == served.api("GET", "/messages/m%2F1")

    code, out, _ = run("msg", "reschedule", "m/1", "--delay-ms", "3600000")
    assert (code, "rescheduled") == (OK, out.split(": ")[1].split(",")[0])
    due = served.redis.zscore(store, "m/1")
    assert due is not None
    assert due > scheduled["dueMs"] + 3_000_000

    code, out, _ = run("msg", "cancel", "m/1")
    assert (code, out.strip()) == (OK, "m/1: cancelled")
    assert served.redis.zscore(store, "m/1") is None
    code, out, _ = run("msg", "get", "m/1")  # remembered: when it finished, and no payload
    rows = dict(line.split(None, 1) for line in out.splitlines() if " " in line.strip())
    assert (rows["state"].strip(), rows["finished"].strip() != "-") == ("cancelled", True)
    assert "not kept once finished" in rows["payload"]
    code, out, err = run("msg", "cancel", "never-scheduled")
    assert code == NOT_FOUND
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "404" in err
    assert "add --slot-basis (or the --slot that holds it)" in err  # the CLI's options


def test_text_from_the_service_cannot_drive_the_terminal(served: Served, run):
    served.api("POST", "/messages", {"id": "esc", "delayMs": 60_000, "payload": "\x1b]0;pwn\x07x"})
    code, out, _ = run("msg", "get", "esc")
    assert code == OK
    assert "\x1b" not in out
    assert "\\x1b]0;pwn\\x07x" in out


def test_bad_input_is_one_line_and_exit_2(served: Served, run, monkeypatch):
    for argv in (
        ("msg", "get", "a\x01b"),  # the service refuses the control character: 400
        ("msg", "get", "x", "--url", "nope"),
        ("msg", "get", ""),
        ("dead", "redrive"),
        ("dead", "redrive", "a", "--all"),
        ("dead", "purge", "--all"),  # without --yes
        ("slots", "--count", "5000"),  # the service's bound: 400 naming count
    ):
        code, out, err = run(*argv)
        assert code == BAD_INPUT, argv
        assert out == ""
        assert len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err
    code, _, err = run("msg", "reschedule", "x", "--delay-ms", "-5")
    assert code == BAD_INPUT  # argparse: usage on stderr, never a traceback
    assert "negative" in err
    monkeypatch.delenv("DELAYQ_TOPIC")
    code, _, err = run("topic", "stats")
    assert code == BAD_INPUT
    assert "--topic" in err


def test_unreachable_and_refused_token_exit_3(served: Served, run, monkeypatch):
    code, _, err = run("topic", "stats", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == UNREACHABLE
    assert "unreachable" in err
    monkeypatch.setenv("DELAYQ_API_TOKEN", "wrong")
    code, _, err = run("slots")
    assert code == UNREACHABLE
    assert "401" in err
    assert "DELAYQ_API_TOKEN" in err


def test_dead_list_redrive_purge(served: Served, run):
    served.api("POST", "/dead/purge", {"all": True})
    served.to_dead(["d1", "d2", "d3"], priority=2, group="acme")
    code, out, _ = run("dead", "list")
    assert code == OK
    assert out.split()[:5] == ["ID", "SLOT", "ATTEMPTS", "PRIORITY", "GROUP"]
    listed = {line.split()[0]: line.split()[3:5] for line in out.splitlines()[1:]}
    assert listed == {name: ["2", "acme"] for name in ("d1", "d2", "d3")}  # priority, group
    assert "boom" in out

    code, out, err = run("dead", "redrive", "d1", "nobody", "--progress")
    assert code == NOT_FOUND  # one of the ids was not dead
    assert out.splitlines()[0] == "1 of 2 redriven"
    assert "redriven [" in err  # the progress bar
    slot = served.api("GET", "/messages/d1")["slot"]
    assert served.redis.zscore(served.key(slot, Part.DEAD), "d1") is None
    assert served.redis.zscore(served.key(slot, Part.STORE), "d1") is not None

    code, out, err = run("dead", "purge", "--all", "--yes", "--progress")
    assert (code, out.strip()) == (OK, "2 purged")
    assert "2/2" in err
    assert sum(served.redis.zcard(served.key(s, Part.DEAD)) for s in range(SLOTS)) == 0


def test_dead_redrive_by_the_listed_slot_finds_a_slot_basis_message(served: Served, run):
    """Its id alone routes to another slot (the record keeps no basis): `--slot` from `dead
    list` or `--slot-basis` finds it, for `dead` and for `msg get|reschedule|cancel`."""
    served.api("POST", "/dead/purge", {"all": True})
    topic = Topic(TOPIC, namespace=NAMESPACE, slot_amount=SLOTS)
    bases = (f"customer-{n}" for n in range(100))
    basis = next(b for b in bases if Target("sb", b).slot(topic) != topic.slot_of("sb"))
    served.to_dead(["sb", "sb2"], slotBasis=basis)
    code, out, _ = run("dead", "list")
    slot = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}["sb"]
    code, out, _ = run("dead", "redrive", "sb")
    assert (code, out.splitlines()[0]) == (NOT_FOUND, "0 of 1 redriven")
    code, out, _ = run("msg", "get", "sb")
    assert code == NOT_FOUND
    code, out, _ = run("msg", "get", "sb", "--slot", slot)
    assert (code, out.splitlines()[1].split()) == (OK, ["state", "dead"])
    code, out, _ = run("dead", "redrive", "sb", "--slot", slot)
    assert (code, out.strip()) == (OK, "1 of 1 redriven")
    assert served.redis.zscore(served.key(int(slot), Part.STORE), "sb") is not None
    code, out, _ = run("msg", "reschedule", "sb", "--slot", slot, "--delay-ms", "3600000")
    assert (code, out.split(",")[0]) == (OK, "sb: rescheduled")
    code, _, err = run("msg", "get", "sb", "--slot", slot, "--slot-basis", basis)
    assert (code, "not allowed with argument" in err) == (BAD_INPUT, True)
    code, out, _ = run("dead", "purge", "sb2", "--slot-basis", basis)
    assert (code, out.strip()) == (OK, "1 of 1 purged")
    code, _, err = run("dead", "purge", "--all", "--yes", "--slot", slot)
    assert (code, len(err.strip().splitlines())) == (BAD_INPUT, 1)
    code, out, _ = run("msg", "cancel", "sb", "--slot", slot)
    assert (code, out.strip()) == (OK, "sb: cancelled")


def test_topic_pause_and_resume_show_in_stats_and_slots(served: Served, run):
    flag = paused_key(Topic(TOPIC, namespace=NAMESPACE, slot_amount=SLOTS))
    try:
        code, out, _ = run("topic", "pause")
        assert (code, out.strip()) == (OK, f"{TOPIC}: delivery paused")
        assert served.redis.exists(flag)
        code, out, _ = run("topic", "stats")
        lines = dict(line.split("  ", 1) for line in out.splitlines())
        assert lines["delivery"].strip().startswith("PAUSED")
        code, out, _ = run("slots", "--count", "1")
        assert out.splitlines()[1].split()[1] == "PAUSED"
        code, out, _ = run("topic", "resume", "--json")
        assert (code, json.loads(out)) == (OK, {"paused": False})
        assert not served.redis.exists(flag)
        code, out, _ = run("topic", "stats")
        assert dict(line.split("  ", 1) for line in out.splitlines())["delivery"].strip() == (
            "running"
        )
    finally:
        served.redis.delete(flag)  # never leave the module's topic paused


def test_schedules_list_get_delete(served: Served, run):
    every = {"everyMs": 3_600_000, "startMs": 2_208_988_800_000, "payload": "tick", "priority": 2}
    every["group"] = "acme"
    served.api("PUT", "/schedules/hourly", every)
    cron = {"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin", "payload": "standup"}
    served.api("PUT", "/schedules/standup", cron)

    code, out, err = run("schedules", "list")
    assert (code, err) == (OK, "")
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "every 1 h" in rows["hourly"]
    assert "cron 0 9 * * 1-5 (Europe/Berlin)" in rows["standup"]
    assert "2040-01-01 00:00:00.000 UTC" in rows["hourly"]  # its first due time

    code, out, _ = run("schedules", "get", "standup", "--json")
    assert (code, json.loads(out)) == (OK, served.api("GET", "/schedules/standup"))
    code, out, _ = run("schedules", "get", "hourly")
    lines = dict(line.split("  ", 1) for line in out.splitlines())
    assert lines["recurrence"].strip() == "every 1 h"
    assert (lines["priority"].strip(), lines["group"].strip()) == ("2", "acme")

    code, out, _ = run("schedules", "delete", "hourly")
    assert (code, out.strip()) == (OK, "hourly: cancelled")
    code, _, err = run("schedules", "get", "hourly")
    assert code == NOT_FOUND
    assert err.startswith("delayq schedules get: HTTP 404")
    assert [s["id"] for s in served.api("GET", "/schedules")["schedules"]] == ["standup"]
    run("schedules", "delete", "standup")


def test_slots_table_names_the_owner(served: Served, run):
    code, out, _ = run("slots", "--count", "3")
    assert code == OK
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["SLOT", "STATUS", "OWNER"]
    assert [row.split()[0] for row in rows[1:]] == ["0", "1", "2"]
    member = served.api("GET", "/overview")["process"]["member"]
    assert all(row.split()[1:3] == ["ok", member] for row in rows[1:])
    code, out, _ = run("slots", "--json", "--only", "attention")
    assert json.loads(out)["slots"] == []


def test_the_installed_command_exits_with_the_code(served: Served):
    """The console script itself (a new process): the code is the process's exit status."""
    env = {"DELAYQ_API_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "delayq.cli", "msg", "get", "absent"]
    argv += ["--url", served.url, "--topic", TOPIC]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == NOT_FOUND
    assert done.stdout == ""
    assert done.stderr.startswith("delayq msg get: HTTP 404")


def test_every_exit_code_is_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["dead", "purge", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code in (OK, NOT_FOUND, BAD_INPUT, UNREACHABLE):
        assert f"{code} " in text


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--timeout", "-1", "--timeout"),  # the socket refused it with a traceback
        ("--timeout", "nan", "--timeout"),
        ("--timeout", "0", "--timeout"),  # every call failed as "unreachable"
        ("--url", "http://127.0.0.1:abc", "--url"),  # urllib's InvalidURL traceback
        ("--url", "http://[::1", "--url"),  # urlsplit's ValueError traceback
        ("--url", "http://127.0.0.1:99999", "--url"),
    ],
)
def test_a_bad_timeout_or_url_is_exit_2_without_a_traceback(flag, value, named, capsys):
    try:
        code = main(["topic", "stats", "--topic", TOPIC, flag, value])
    except SystemExit as exit_:  # argparse
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == BAD_INPUT
    assert "Traceback" not in err
    assert named in err.strip().splitlines()[-1]


def test_an_answer_cut_short_is_one_line_and_exit_3(capsys):
    """A service (or a proxy) that closes the connection mid-body: http.client's IncompleteRead
    is no OSError, and it ended in a traceback."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100"
            connection.sendall(head + b"\r\n\r\n" + b'{"a":')

    server = threading.Thread(target=answer_half)
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert main(["topic", "stats", "--topic", TOPIC, "--url", url]) == UNREACHABLE
    finally:
        server.join()
        listener.close()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"delayq topic stats: {url} broke off its answer: IncompleteRead")
