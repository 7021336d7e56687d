"""The broker pods' start script, run for real: a master and a replica from the rendered env.

No kubelet runs the pods here (issue 12), so this is what proves the script's redis.conf lines
(the ACL users, `masteruser`) are ones redis-server accepts: only the pod-only paths (the data
directory, the port, the downward-API labels file, the master Service host) are replaced by
local ones; the environment is the StatefulSet's own, secrets filled in.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from delayq.kube.builders.redis import REDIS_START_SCRIPT
from delayq.local.ports import free_port
from delayq.local.process import stop_by_pid
from delayq.local.waiting import wait_until
from delayq.queue import acl
from delayq.queue.client import Queue
from delayq.queue.topic import Topic
from tests.kube.test_replicated_writes import redis_env

pytestmark = pytest.mark.timeout(180)

PASSWORD, ADMIN_PASSWORD = "service-secret", "admin-secret"
TOPIC = Topic("orders", namespace="shop", slot_amount=4)  # spec_of()'s topic


def start_pod(
    tmp_path: Path, name: str, master_port: int | None
) -> tuple[subprocess.Popen[bytes], int]:
    """The start script of one broker pod on a local port (master when master_port is None)."""
    port = free_port()
    data = tmp_path / name
    data.mkdir()
    labels = tmp_path / f"{name}.labels"
    labels.write_text('delayq.io/redis-role="master"\n' if master_port is None else "")
    script = (
        REDIS_START_SCRIPT.replace("--port 6379", f"--port {port}")
        .replace("--dir /data", f"--dir {data}")
        .replace("/etc/podinfo/labels", str(labels))
        .replace("$MASTER_HOST 6379", f"127.0.0.1 {master_port}")
    )
    for pod_only in ("6379", "/data", "/etc/podinfo", "$MASTER_HOST 6379"):  # all replaced
        assert pod_only not in script
    env = {
        **os.environ,
        **redis_env(),
        "POD_IP": "127.0.0.1",
        "REDIS_PASSWORD": PASSWORD,
        "REDIS_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "REDISCLI_AUTH": PASSWORD,
    }
    process = subprocess.Popen(
        ["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return process, port


def admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=acl.ADMIN_USER, password=ADMIN_PASSWORD)


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
    with redis.Redis(port=master_port, username=acl.SERVICE_USER, password=PASSWORD) as service:
        queue = Queue(service, TOPIC)
        queue.schedule("m", b"p", delay_ms=0)  # the engine works as the restricted user
        assert queue.stats().scheduled == 1
        with pytest.raises(NoPermissionError):
            service.config_get("maxmemory")
        with pytest.raises(NoPermissionError):
            service.set("dq:{shop/other/0}:epoch", "1")
    # the replica logs in to the master as the admin user (masteruser/masterauth)
    wait_until(
        lambda: _replication(replica_port).get("master_link_status") == "up",
        60,
        "the replica's link to the master",
    )
    assert _replication(master_port)["role"] == "master"
