"""The leader's health loop: each topic its own pass, so no topic holds up or breaks another."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import kmock
import kopf
import pytest

from delayq.kube.context import Logger, OperatorContext
from delayq.kube.healthloop import HealthLoop
from tests.kube.conftest import DT
from tests.kube.pods import NAMESPACE
from tests.kube.test_deletion import put_topic


async def test_a_hanging_or_failing_topic_never_stops_the_others(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ("slow", "broken", "fine"):
        put_topic(api, name)
    passes: Counter[str] = Counter()
    release = asyncio.Event()

    async def run_pass(topic: Mapping[str, Any], log: Logger) -> None:
        name = topic["metadata"]["name"]
        passes[name] += 1
        if name == "slow":
            await release.wait()  # hangs for the whole test
        if name == "broken":
            raise RuntimeError("a bug in one topic's pass")

    loop = HealthLoop(ctx, [NAMESPACE], 0.05, run_pass, logger)
    task = asyncio.create_task(loop.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while passes["fine"] < 5 or passes["broken"] < 5:
            assert asyncio.get_running_loop().time() < deadline, passes
            await asyncio.sleep(0.05)
        assert passes["slow"] == 1  # still in flight: never started twice
        assert f"[{NAMESPACE}/broken] health pass failed unexpectedly" in caplog.text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not loop.passes  # the hanging pass was cancelled with the loop


async def test_a_transient_failure_backs_off_and_deleted_topics_are_forgotten(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api, "flaky")
    passes: Counter[str] = Counter()

    async def run_pass(topic: Mapping[str, Any], log: Logger) -> None:
        passes[topic["metadata"]["name"]] += 1
        raise kopf.TemporaryError("ZooKeeper down", delay=60)

    loop = HealthLoop(ctx, [NAMESPACE], 0.01, run_pass, logger)
    for _ in range(20):
        await loop.tick()
        await asyncio.sleep(0.01)
    assert passes["flaky"] == 1  # then it waits for its 60 s backoff
    assert (NAMESPACE, "flaky") in loop.retry_at
    api.objects[DT, NAMESPACE, "flaky"].delete()
    await loop.tick()
    assert loop.retry_at == {}
    if loop.gc is not None:
        await loop.gc


async def test_a_pass_stuck_on_an_unanswered_call_is_abandoned_and_run_again(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pass that never returns (a call nobody answers) must not stop that topic's passes,
    and with them its failovers, for good: it is abandoned after the bound and run again."""
    put_topic(api, "stuck")
    passes: Counter[str] = Counter()

    async def run_pass(topic: Mapping[str, Any], log: Logger) -> None:
        passes[topic["metadata"]["name"]] += 1
        await asyncio.Event().wait()  # never answered

    loop = HealthLoop(ctx, [NAMESPACE], 0.02, run_pass, logger, pass_timeout_s=0.1)
    task = asyncio.create_task(loop.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while passes["stuck"] < 3:
            assert asyncio.get_running_loop().time() < deadline, passes
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert f"[{NAMESPACE}/stuck] health pass took over 0.1 s: abandoned" in caplog.text
