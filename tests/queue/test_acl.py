"""The topic's restricted Redis user (delayq.queue.acl) on a real redis-server: it can run the
engine (every test using the `queue` fixtures connects as it) and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from delayq.local.redis_server import RedisServer
from delayq.queue import acl, keys
from delayq.queue.client import Queue
from delayq.queue.codes import ReplicationTimeoutError
from delayq.queue.model import Retry, ScheduleRequest
from delayq.queue.topic import Topic

from .conftest import ENGINE_USER, TOPIC, engine_client

LUA = Path(acl.__file__).parent / "lua"
OTHER = Topic("payments", namespace="billing", slot_amount=4)


@pytest.fixture
def restricted(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    client = engine_client(redis_server, redis_client)
    try:
        yield client
    finally:
        client.close()


def test_every_command_the_scripts_call_is_granted_and_no_other() -> None:
    called: set[str] = set()
    for path in LUA.rglob("*.lua"):
        source = path.read_text()
        called |= {name.lower() for name in re.findall(r"redis\.p?call\('([A-Z]+)'", source)}
        called |= {name.lower() for name in re.findall(r"_chunked\('([A-Z]+)'", source)}
    assert called == set(acl.SCRIPT_COMMANDS)


def test_the_engine_runs_as_the_restricted_user(restricted: redis.Redis) -> None:
    queue = Queue(restricted, TOPIC)
    queue.schedule_many([ScheduleRequest(f"m{i}", b"p", delay_ms=0) for i in range(8)])
    for slot in TOPIC.slots:
        batch = queue.claim(slot, queue.take_over(slot))
        queue.extend_many([m.lease for m in batch.messages], 60_000)
        queue.nack_many([Retry(m.lease, dead=True, reason="x") for m in batch.messages])
    assert queue.stats().dead == 8
    assert queue.redrive_all() == 8
    assert queue.purge_all() == 0  # nothing dead any more
    assert queue.stats().scheduled == 8
    # a topic replicating synchronously sends WAIT: refused, every write would fail
    sync = Queue(restricted, replace(TOPIC, redis_sync_replicas=1, redis_sync_timeout_ms=20))
    with pytest.raises(ReplicationTimeoutError) as caught:  # no replica here, but no NOPERM
        sync.schedule("w", b"p", delay_ms=0)
    assert caught.value.confirmed == 0


@pytest.mark.parametrize(
    "command",
    [
        ("CONFIG", "GET", "maxmemory"),
        ("CONFIG", "SET", "appendonly", "no"),
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("KEYS", "*"),
        ("SCAN", "0"),
        ("SCRIPT", "FLUSH"),
        ("CLIENT", "LIST"),
        ("CLIENT", "PAUSE", "1000"),
        ("SHUTDOWN", "NOSAVE"),
        ("REPLICAOF", "NO", "ONE"),
        ("ACL", "LIST"),
        ("EVAL", "return 1", "0"),
        ("EVAL_RO", "return 1", "0"),
        ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"),
        ("SCRIPT", "LOAD", "return 1"),
        ("FUNCTION", "LOAD", "#!lua name=mine\nredis.register_function('mine', function() end)"),
        ("FUNCTION", "DELETE", "anything"),
        ("FUNCTION", "FLUSH"),
        ("FUNCTION", "RESTORE", "x"),
        ("RESTORE", "dq:{shop/orders/0}:store", "0", "x"),
        ("DUMP", "dq:{shop/orders/0}:store"),
        ("MODULE", "LIST"),
        ("SUBSCRIBE", "anything"),
        ("MONITOR",),
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_the_restricted_user_cannot_administer_redis(
    restricted: redis.Redis, command: tuple[str, ...]
) -> None:
    with pytest.raises(NoPermissionError):
        restricted.execute_command(*command)


def test_the_restricted_user_cannot_run_code_of_its_own(
    restricted: redis.Redis, redis_client: redis.Redis
) -> None:
    """The issue's attack: a busy loop loaded and run blocked the broker. Neither way in is
    open; FCALL reaches only what the admin loaded, so the broker still answers at once."""
    busy = "while true do end"
    with pytest.raises(NoPermissionError):
        restricted.script_load(busy)
    library = f"#!lua name=busy\nredis.register_function('busy', function() {busy} end)"
    with pytest.raises(NoPermissionError):
        restricted.function_load(library)
    with pytest.raises(redis.ResponseError, match="Function not found"):
        restricted.fcall("busy", 0)
    assert redis_client.ping()
    assert redis_client.function_list(library="busy") == []
    # DEBUG is off on this server whatever the user (enable-debug-command): ask the ACL itself
    for command in (("DEBUG", "SLEEP", "0"), ("DEBUG", "RELOAD"), ("MODULE", "LOAD", "/x.so")):
        verdict = redis_client.execute_command("ACL", "DRYRUN", ENGINE_USER, *command)
        assert b"no permissions" in verdict, verdict


def test_the_restricted_user_cannot_touch_another_topics_keys(
    restricted: redis.Redis, redis_client: redis.Redis
) -> None:
    Queue(redis_client, OTHER).schedule("theirs", b"secret", delay_ms=60_000)
    their_key = next(iter(redis_client.keys("dq:{billing/payments/*")))
    for command in (("TYPE", their_key), ("DEL", their_key), ("SET", "dq:{billing/x", "1")):
        with pytest.raises(NoPermissionError):
            restricted.execute_command(*command)
    with pytest.raises(NoPermissionError):  # the engine's scripts are checked per key, too
        Queue(restricted, OTHER).get("theirs")
    assert Queue(redis_client, OTHER).get("theirs").payload == b"secret"


def test_the_backup_needs_only_reads_the_service_user_already_has(
    redis_client: redis.Redis,
) -> None:
    """A backup runs with the pipeline's (the service's) Redis user and adds no right to it:
    every command it sends is one the service user has, and Redis flags none of them a write."""
    service = set(acl.CLIENT_COMMANDS) | set(acl.SCRIPT_COMMANDS)
    assert set(acl.BACKUP_COMMANDS) <= service
    for command in acl.BACKUP_COMMANDS:
        info = redis_client.execute_command("COMMAND", "INFO", command)[command]
        assert "write" not in info["flags"], command


def test_every_key_the_engine_owns_is_in_its_key_space() -> None:
    """`keys.ENGINE_KEY_PREFIXES` (what a tenant's stream key may not start with) covers every
    key the engine names and every pattern its users are granted, so a new key cannot ship
    outside it and become nameable as a stream key."""
    slot = keys.slot_keys(replace(TOPIC, slot_generation=1), 0)
    named = [
        *slot.keys(*keys.Part),
        *keys.slot_keys(TOPIC, 0).keys(*keys.Part),
        slot.settings,
        keys.control_key(TOPIC, "c1"),
        keys.paused_key(TOPIC),
        keys.pace_key(TOPIC),
        *acl.key_patterns(TOPIC),
        acl.settings_pattern(TOPIC),
    ]
    assert [key for key in named if not keys.is_engine_key(key)] == []
    assert not keys.is_engine_key("dq-out:shop/orders")  # the default stream key
