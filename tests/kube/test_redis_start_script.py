"""The broker pods' start script and preStop hook, run for real from the rendered env.

No kubelet runs the pods here (issue 12), so this is what proves the script's redis.conf lines
(the ACL users, `masteruser`) are ones redis-server accepts: only the pod-only paths (the data
directory, the port, the master Service host) are replaced by local ones; the environment is
the StatefulSet's own, secrets filled in, with the master's name (MASTER_POD, from the
operator's ConfigMap) naming this pod or not.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from delayq.kube.builders.redis import REDIS_PRESTOP_SCRIPT, REDIS_START_SCRIPT
from delayq.kube.redisctl import RedisCommands
from delayq.local.ports import free_port
from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until
from delayq.queue import acl
from delayq.queue.client import Queue
from delayq.queue.functions import FunctionsMissingError
from delayq.queue.topic import Topic
from tests.kube.manifests import by_kind_name, rendered, spec_of
from tests.kube.test_replicated_writes import redis_env

pytestmark = pytest.mark.timeout(180)

PASSWORD, ADMIN_PASSWORD = "service-secret", "admin-secret"
TOPIC = Topic("orders", namespace="shop", slot_amount=4)  # spec_of()'s topic


def start_pod(
    tmp_path: Path, name: str, master_port: int | None, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """The start script of one broker pod on a local port (master when master_port is None);
    a second start of the same `name` is its container's restart on the same volume. `env`:
    the pod's own (`pod_env`), by default that of broker 0 of a pull topic."""
    port = free_port()
    data = tmp_path / name
    data.mkdir(exist_ok=True)
    script = (
        REDIS_START_SCRIPT.replace("--port 6379", f"--port {port}")
        .replace("--dir /data", f"--dir {data}")
        .replace("$MASTER_HOST 6379", f"127.0.0.1 {master_port}")
    )
    for pod_only in ("6379", "/data", "$MASTER_HOST 6379"):  # all replaced
        assert pod_only not in script
    process = subprocess.Popen(
        ["sh", "-c", script],
        env={
            **(env or pod_env()),
            "POD_NAME": name,
            "POD_UID": "uid-1",
            "MASTER_POD": f"{name}/uid-1" if master_port is None else f"{name}/uid-0",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, port


def pod_env(rendered_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container's environment, secrets filled in (what the kubelet gives both scripts)."""
    return {
        **os.environ,
        **(rendered_env or redis_env()),
        "POD_IP": "127.0.0.1",
        "REDIS_PASSWORD": PASSWORD,
        "REDIS_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "REDISCLI_AUTH": PASSWORD,
    }


#: What no restricted user (service, stream reader) may run: code of its own, raw payloads.
NO_CODE = (
    ("EVAL", "while true do end", "0"),
    ("SCRIPT", "LOAD", "while true do end"),
    ("EVALSHA", "0" * 40, "0"),
    ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() end)"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "x"),
    ("RESTORE", "dq:{shop/orders/0}:x", "0", "payload"),
    ("MODULE", "LIST"),
)


def load_as_operator(port: int) -> bool:
    """The operator's health pass step: FUNCTION LOAD as `delayq-operator` (redisctl)."""
    control = RedisCommands(addresses={"master": ("127.0.0.1", port)})
    return asyncio.run(control.load_functions("master", ADMIN_PASSWORD))


def admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=acl.ADMIN_USER, password=ADMIN_PASSWORD)


def service(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=acl.SERVICE_USER, password=PASSWORD)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A master pod and a replica pod of broker 0, both answering."""
    master, master_port = start_pod(tmp_path, "master", None)
    replica, replica_port = start_pod(tmp_path, "replica", master_port)
    try:
        wait_until(lambda: _pings(master_port) and _pings(replica_port), 60, "both pods")
        yield master_port, replica_port
    finally:
        for process in (replica, master):
            stop_by_pid(process, 10)


def _replication(port: int) -> dict[str, object]:
    with admin(port) as client:
        return dict(client.info("replication"))


def _pings(port: int) -> bool:
    try:
        with admin(port) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def test_the_users_of_the_start_script(pods: tuple[int, int]) -> None:
    master_port, replica_port = pods
    with redis.Redis(port=master_port) as anonymous, pytest.raises(redis.RedisError):
        anonymous.ping()  # `default` is off
    posing = redis.Redis(port=master_port, username="default", password="x")
    with posing, pytest.raises(redis.AuthenticationError):  # whatever its rules (AOF replay)
        posing.ping()
    with service(master_port) as client:
        queue = Queue(client, TOPIC)
        with pytest.raises(FunctionsMissingError):  # until the operator has loaded them
            queue.schedule("m", b"p", delay_ms=0)
        assert load_as_operator(master_port)
        assert not load_as_operator(master_port)  # the next pass finds them
        queue.schedule("m", b"p", delay_ms=0)  # the engine works as the restricted user
        assert queue.stats().scheduled == 1
        with pytest.raises(NoPermissionError):
            client.config_get("maxmemory")
        with pytest.raises(NoPermissionError):
            client.set("dq:{shop/other/0}:epoch", "1")
        for command in NO_CODE:
            with pytest.raises(NoPermissionError):
                client.execute_command(*command)
    with admin(master_port) as client:
        assert client.config_get("sanitize-dump-payload") == {"sanitize-dump-payload": "yes"}
    # the replica logs in to the master as the admin user (masteruser/masterauth)
    wait_until(
        lambda: _replication(replica_port).get("master_link_status") == "up",
        60,
        "the replica's link to the master",
    )
    assert _replication(master_port)["role"] == "master"
    with service(replica_port) as client:  # the library replicated, read-only calls run there
        on_replica = Queue(client, TOPIC)
        wait_until(lambda: on_replica.stats().scheduled == 1, 10, "the message on the replica")


def test_a_master_killed_and_restarted_keeps_every_message(tmp_path: Path) -> None:
    """kill -9 of a master's redis-server, then its start on the same data directory (kubelet
    restarting the container) gives back every message the engine stored. Its scripts reach the
    AOF as MULTI/EXEC, which Redis 7.0 replays as `default` and re-checks against that user's
    rules: with `default` off and no permissions, each was dropped on load, the master came back
    with none of them and its replica, resyncing, lost them too."""
    process, port = start_pod(tmp_path, "master", None)
    try:
        wait_until(lambda: _pings(port), 60, "the master")
        assert load_as_operator(port)
        with service(port) as client:
            queue = Queue(client, TOPIC)
            for index in range(20):
                queue.schedule(f"m{index}", b"p", delay_ms=3_600_000)
            assert queue.stats().scheduled == 20
        process.kill()
        process.wait()
        process, port = start_pod(tmp_path, "master", None)
        wait_until(lambda: _pings(port), 60, "the restarted master")
        with service(port) as client:
            queue = Queue(client, TOPIC)
            assert queue.stats().scheduled == 20  # the functions came back from the AOF too
            assert queue.get("m7").payload == b"p"
    finally:
        stop_by_pid(process, 10)


def pre_stop(port: int) -> subprocess.Popen[bytes]:
    """The preStop hook as the kubelet runs it in the pod whose Redis listens on `port`."""
    assert REDIS_PRESTOP_SCRIPT.count("-p 6379") == 1
    script = REDIS_PRESTOP_SCRIPT.replace("-p 6379", f"-p {port}")
    return subprocess.Popen(["sh", "-c", script], env=pod_env())


def _connections(port: int) -> int:
    with admin(port) as client:
        return int(client.info("stats")["total_connections_received"])


def test_the_pre_stop_hook_holds_a_master_until_it_is_switched_over(
    pods: tuple[int, int],
) -> None:
    master_port, replica_port = pods
    wait_until(
        lambda: _replication(master_port).get("connected_slaves") == 1, 60, "a linked replica"
    )
    before = _connections(master_port)
    hook = pre_stop(master_port)
    try:
        # several rounds of the hook's check (each a connection) and it still waits
        wait_until(lambda: _connections(master_port) >= before + 4, 30, "the hook's checks")
        assert hook.poll() is None
        with admin(replica_port) as client:  # the operator's switchover, in short
            client.replicaof("NO", "ONE")
        with admin(master_port) as client:
            client.replicaof("127.0.0.1", str(replica_port))
        wait_until(lambda: hook.poll() is not None, 10, "the hook to return")
        assert hook.returncode == 0
    finally:
        stop_by_pid(hook, 5)


def test_the_pre_stop_hook_does_not_wait_on_a_replica_or_a_master_without_one(
    pods: tuple[int, int],
) -> None:
    """The bound is 30 s; a replica, and a master with nothing to switch to, stop at once."""
    _, replica_port = pods
    hook = pre_stop(replica_port)
    wait_until(lambda: hook.poll() is not None, 10, "the replica's hook to return")
    with admin(replica_port) as client:  # now a master of its own, without replicas
        client.replicaof("NO", "ONE")
    assert _replication(replica_port)["connected_slaves"] == 0
    hook = pre_stop(replica_port)
    wait_until(lambda: hook.poll() is not None, 10, "the lone master's hook to return")
    assert hook.returncode == 0


READER_PASSWORD = "reader-secret"
STREAM = "dq-out:shop/orders"  # the default target stream of spec_of()'s topic


def stream_broker_env(broker: int) -> dict[str, str]:
    """Broker `broker`'s pod env of a 2-broker stream topic written to its own broker 0."""
    manifests = by_kind_name(rendered(spec_of(topicType="stream", brokers=2)))
    sts = manifests["StatefulSet", f"orders-redis-{broker}"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    rendered_env = {item["name"]: item.get("value", "") for item in container["env"]}
    return {**pod_env(rendered_env), "STREAM_READER_PASSWORD": READER_PASSWORD}


def reader(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=acl.STREAM_READER_USER, password=READER_PASSWORD)


def test_the_stream_reader_consumes_its_stream_and_nothing_else(tmp_path: Path) -> None:
    """Broker 0's reader user, as the consumer pods log in with the reader Secret: a consumer
    group reads and acknowledges what the delay service appended; it can write no entry,
    touch no other key, drop no group; the other broker has no such user."""
    zero, zero_port = start_pod(tmp_path, "broker-0", None, stream_broker_env(0))
    one, one_port = start_pod(tmp_path, "broker-1", None, stream_broker_env(1))
    try:
        wait_until(lambda: _pings(zero_port) and _pings(one_port), 60, "both brokers")
        with reader(zero_port) as consumer, service(zero_port) as delay_service:
            consumer.xgroup_create(STREAM, "billing", id="0", mkstream=True)
            entry = delay_service.xadd(STREAM, {"id": "m1", "payload": "p"})
            ((_, [(read_id, fields)]),) = consumer.xreadgroup("billing", "c1", {STREAM: ">"})
            assert (read_id, fields[b"id"]) == (entry, b"m1")
            assert consumer.xpending(STREAM, "billing")["pending"] == 1
            assert consumer.xack(STREAM, "billing", read_id) == 1
            assert consumer.xinfo_groups(STREAM)[0]["pending"] == 0
            assert consumer.xlen(STREAM) == 1
            delay_service.set("dq:{shop/orders}:probe", "1")
            refused = (
                ("XADD", STREAM, "*", "id", "forged"),
                ("XDEL", STREAM, read_id),
                ("XTRIM", STREAM, "MAXLEN", "0"),
                ("DEL", STREAM),
                ("XGROUP", "DESTROY", STREAM, "billing"),
                ("GET", "dq:{shop/orders}:probe"),  # the topic's own keys
                ("XLEN", "dq-out:shop/payments"),  # another topic's stream
                ("KEYS", "*"),
                ("CONFIG", "GET", "maxmemory"),
                *NO_CODE,
            )
            for command in refused:
                with pytest.raises(NoPermissionError):
                    consumer.execute_command(*command)
            assert consumer.xlen(STREAM) == 1
        with reader(one_port) as elsewhere, pytest.raises(redis.AuthenticationError):
            elsewhere.ping()
    finally:
        for process in (one, zero):
            stop_by_pid(process, 10)


BACKUP_PASSWORD = "backup-secret"


def test_the_backup_user_reads_the_topics_keys_and_writes_nothing(tmp_path: Path) -> None:
    """With spec.backup every broker has the read-only backup user the CronJob logs in as: it
    reads the topic's messages (what `pipeline backup` reads) and can change nothing."""
    manifests = by_kind_name(rendered(spec_of(backup={"schedule": "@daily", "volumeClaim": "b"})))
    (container,) = manifests["StatefulSet", "orders-redis-0"]["spec"]["template"]["spec"][
        "containers"
    ]
    rendered_env = {item["name"]: item.get("value", "") for item in container["env"]}
    env = {**pod_env(rendered_env), "BACKUP_PASSWORD": BACKUP_PASSWORD}
    process, port = start_pod(tmp_path, "broker-0", None, env)
    try:
        wait_until(lambda: _pings(port), 60, "the broker")
        assert load_as_operator(port)
        Queue(service(port), Topic("orders", namespace="shop", slot_amount=16)).schedule(
            "m1", b"p", delay_ms=60_000
        )
        with redis.Redis(port=port, username=acl.BACKUP_USER, password=BACKUP_PASSWORD) as user:
            keys = [key for key in admin(port).keys("dq:{shop/orders/*") if b":msg" in key]
            assert keys
            assert user.hgetall(keys[0])  # reads the message
            refused = (
                ("HSET", keys[0], "payload", "forged"),
                ("DEL", keys[0]),
                ("FCALL", "anything", "0"),
                ("ZADD", "dq:{shop/orders/0}:store", "1", "x"),
                ("GET", "dq:{shop/payments/0}:epoch"),  # another topic's keys
                ("KEYS", "*"),
                ("FLUSHALL",),
                *NO_CODE,
            )
            for command in refused:
                with pytest.raises(NoPermissionError):
                    user.execute_command(*command)
    finally:
        stop_by_pid(process, 10)
