"""BrokerFull: the health pass reads each master's INFO memory and warns before the memory guard
refuses, and says so when it does (real redis-servers playing the pods, see pods.py)."""

from __future__ import annotations

import logging

import kmock
import pytest
from kazoo.client import KazooClient

from delayq.kube.conditions import broker_full_condition
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.redisctl import BrokerMemory
from delayq.kube.status import Condition
from delayq.queue import BrokerFullError
from tests.kube.conftest import own_slots
from tests.kube.pods import RedisPods, add_service_pods
from tests.kube.test_events import posted, run
from tests.kube.test_handlers import body, condition, put_topic

MIB = 1024 * 1024
PAD_BYTES = 8 * MIB  # a large value, so the operator's own connections move the ratio < 1%


def test_the_condition_from_the_masters_figures() -> None:
    def at(used_mib: float, max_mib: int = 100) -> BrokerMemory:
        return BrokerMemory(int(used_mib * MIB), max_mib * MIB)

    def of(memory: dict[int, BrokerMemory]) -> Condition:
        condition = broker_full_condition(memory)
        assert condition is not None
        return condition

    assert broker_full_condition({}) is None  # no master answered: keep what was known
    fine = of({0: at(89.9), 1: at(10)})
    assert (fine.status, fine.reason) == ("False", "MemoryAvailable")
    pressure = of({0: at(10), 1: at(90)})
    assert (pressure.status, pressure.reason) == ("True", "MemoryPressure")
    assert pressure.message.startswith("broker 1 uses 90% of maxmemory (90 of 100 MiB):")
    full = of({0: at(100), 1: at(95)})
    assert (full.status, full.reason) == ("True", "BrokerFull")
    assert "broker 0 uses 100% of maxmemory (100 of 100 MiB); broker 1 uses 95%" in full.message
    assert "HTTP 429" in full.message
    assert of({0: BrokerMemory(5 * MIB, 0)}).reason == "NoMaxMemory"
    # the figures are whole percent and MiB: a few bytes more is the same message (no write)
    assert broker_full_condition({0: at(95)}) == broker_full_condition({0: at(95.001)})


def used_memory_bytes(redis_pods: RedisPods, pod: str) -> int:
    with redis_pods.client(pod) as client:
        return int(client.info("memory")["used_memory"])


def set_maxmemory(redis_pods: RedisPods, pod: str, max_memory_bytes: int) -> None:
    with redis_pods.client(pod) as client:
        client.config_set("maxmemory", max_memory_bytes)


async def test_pressure_then_full_then_room_each_told_once(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api, slotAmount=4)
    await run(ctx, api, logger, reconcile)
    redis_pods.add(0, 1, master=0)
    add_service_pods(api, 1)
    own_slots(zk, 4)
    master = "orders-redis-0-0"
    with redis_pods.client(master) as client:
        client.set("pad", b"x" * PAD_BYTES)
    await run(ctx, api, logger, refresh)
    assert condition(api, "BrokerFull")["reason"] == "NoMaxMemory"  # the pool has no limit

    set_maxmemory(redis_pods, master, int(used_memory_bytes(redis_pods, master) / 0.95))
    for _ in range(2):
        await run(ctx, api, logger, refresh)
    pressure = condition(api, "BrokerFull")
    assert (pressure["status"], pressure["reason"]) == ("True", "MemoryPressure")
    assert pressure["message"].startswith("broker 0 uses 9")
    assert posted(api).count(("Warning", "MemoryPressure")) == 1

    # Over maxmemory: the memory guard refuses a schedule, and the condition says so.
    set_maxmemory(redis_pods, master, used_memory_bytes(redis_pods, master) - 2 * MIB)
    queue = redis_pods.queue(master, slot_amount=4)
    with pytest.raises(BrokerFullError):
        queue.schedule("refused", b"x", delay_ms=60_000)
    queue.close()
    await run(ctx, api, logger, refresh)
    full = condition(api, "BrokerFull")
    assert (full["status"], full["reason"]) == ("True", "BrokerFull")
    assert posted(api).count(("Warning", "BrokerFull")) == 1
    assert condition(api, "Ready")["status"] == "True"  # full refuses writes, still serves

    set_maxmemory(redis_pods, master, 1024 * MIB)
    await run(ctx, api, logger, refresh)
    assert condition(api, "BrokerFull")["reason"] == "MemoryAvailable"
    assert posted(api)[-1] == ("Normal", "MemoryAvailable")
    assert body(api)["status"]["brokers"][0]["state"] == "Ready"
