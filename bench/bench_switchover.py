"""The writes' pause of a planned switchover: a throw-away master + replica, JSON on stdout.

    python bench/bench_switchover.py [--switchovers 10] [--writes-between 300]

A writer schedules messages one after another (`Queue.schedule`, paced at ~1 per ms, retried on
any error through an address that follows the master, as a delay service does through the
master Service: tests/kube/pods.py `ServiceWriter`) while the operator's own switchover commands
(`RedisCommands.hand_over`, the master address moved, `release`) move the master back and forth.
Per switchover it reports the operator's pause (CLIENT PAUSE to release) and the client's (the
longest gap between two acknowledged writes around it); the same-run baseline is the longest gap
between acknowledgements while nothing is switched. Every acknowledged message is then looked up
on the last master: `lost` must be 0.

Not included: the role label's API round trip and the Service's endpoint propagation of a real
cluster (tests/kube/test_switchover.py runs the full health pass against kmock). Before the
switchover a planned restart cost failoverGraceSeconds (30 s by default) plus up to one health
interval of writes refused.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import time
from typing import Any

import redis
from tests.kube.pods import ServiceWriter

from delayq.kube.redisctl import RedisCommands
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import Queue, State, Target, Topic, acl

PASSWORD = "bench-admin"
TOPIC = Topic("bench", namespace="bench", slot_amount=16)
TARGET_MS = 1000.0
MASTER = "master-service"  # the address the writer resolves: follows the master


def _admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, username=acl.ADMIN_USER, password=PASSWORD)


def _start() -> list[RedisServer]:
    servers = [RedisServer(extra_config={"repl-diskless-sync-delay": "0"}).start() for _ in (0, 1)]
    for server in servers:
        with redis.Redis(port=server.port) as client:
            client.config_set("masteruser", acl.ADMIN_USER)
            client.config_set("masterauth", PASSWORD)
            rules = [*acl.ADMIN_RULES, f">{PASSWORD}"]
            client.execute_command("ACL", "SETUSER", acl.ADMIN_USER, *rules)
            client.execute_command("ACL", "SETUSER", "default", "off")
    with _admin(servers[1]) as client:
        client.replicaof("127.0.0.1", str(servers[0].port))
    return servers


def _linked(replica: RedisServer, master: RedisServer) -> bool:
    with _admin(replica) as r, _admin(master) as m:
        info, master_info = r.info("replication"), m.info("replication")
    return bool(
        info.get("master_link_status") == "up"
        and info.get("slave_repl_offset") == master_info.get("master_repl_offset")
    )


def _gap_ms(acked: list[tuple[str, float]], start: float, end: float) -> float:
    """The longest gap between consecutive acknowledgements that overlaps [start, end]."""
    times = [at for _, at in acked]
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
    return max(gaps, default=0.0) * 1000


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(switchovers: int, writes_between: int) -> dict[str, Any]:
    servers = _start()
    names = {"pod-0": servers[0], "pod-1": servers[1]}
    addresses = {name: ("127.0.0.1", server.port) for name, server in names.items()}
    addresses[MASTER] = addresses["pod-0"]
    commands = RedisCommands(addresses=addresses)
    master, replica = "pod-0", "pod-1"
    operator_ms: list[float] = []
    client_ms: list[float] = []
    baseline_ms: list[float] = []
    try:
        with ServiceWriter(lambda: addresses[MASTER], PASSWORD, TOPIC) as writer:
            for _ in range(switchovers):
                linked = functools.partial(_linked, names[replica], names[master])
                wait_until(linked, 30, "a linked replica")
                quiet_from = time.monotonic()
                writer.wait_for(writes_between)
                baseline_ms.append(_gap_ms(writer.acked, quiet_from, time.monotonic()))
                started = time.monotonic()
                asyncio.run(commands.hand_over(master, replica, PASSWORD))
                addresses[MASTER] = addresses[replica]  # the role label and the Service
                asyncio.run(commands.release(master, PASSWORD))
                released = time.monotonic()
                operator_ms.append((released - started) * 1000)
                writer.wait_for(writes_between)
                client_ms.append(_gap_ms(writer.acked, started, released))
                master, replica = replica, master
        ids = [message_id for message_id, _ in writer.acked]
        queue = Queue(_admin(names[master]), TOPIC)
        try:
            infos = queue.get_many([Target(message_id) for message_id in ids])
            lost = sum(1 for info in infos if info.state is not State.SCHEDULED)
        finally:
            queue.close()
    finally:
        for server in servers:
            server.stop()
    worst = max(client_ms)
    return {
        "switchovers": switchovers,
        "writes_acknowledged": len(ids),
        "write_failures_retried": writer.failures,
        "lost": lost,
        "operator_pause_ms": {"p50": _quantile(operator_ms, 0.5), "max": max(operator_ms)},
        "client_pause_ms": {"p50": _quantile(client_ms, 0.5), "max": worst},
        "baseline_max_gap_ms": max(baseline_ms),
        "ratio_client_pause_vs_baseline": worst / max(baseline_ms),
        "target_ms": TARGET_MS,
        "target_met": worst <= TARGET_MS and lost == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--switchovers", type=int, default=10)
    parser.add_argument("--writes-between", type=int, default=300)
    args = parser.parse_args()
    print(json.dumps(run(args.switchovers, args.writes_between), indent=2))


if __name__ == "__main__":
    main()
