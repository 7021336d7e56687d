"""The planned switchover: a stopping master hands its role to a caught-up replica first.

A rollout, a drain, an eviction or `kubectl delete pod` gives the master's pod a
deletionTimestamp and runs its preStop hook (builders/redis.py), which keeps Redis serving until
the pod is no longer master. The health pass sees the terminating master (failover.decide) and
switches over, so the write pause is this switch (milliseconds), not failoverGraceSeconds:

1. `hand_over` (redisctl): CLIENT PAUSE WRITE on the old master, wait until the replica has the
   master's replication offset of the master's own stream (same replication id: nothing
   acknowledged is lost), REPLICAOF NO ONE on the replica,
   REPLICAOF <replica> on the old master. Until the old master is a replica its writes stay
   paused, and the promoted replica has no clients (the master Service's EndpointSlice still
   points at the old master): never two masters that accept writes.
2. The replica is recorded as master and the master Service's EndpointSlice points at it
   (master_endpoint.publish_master): the delay services follow.
3. `release`: the old master's clients are disconnected and its pause ends; their writes
   that waited fail unexecuted (never acknowledged) and are retried through the Service.
4. The other replicas are pointed at the master Service again.

If the operator stops between steps, the next pass repairs from what it finds (failover.decide:
a recorded master running as a replica is promoted again, a stray master is demoted); the
pause ends by itself after redisctl.SWITCH_PAUSE_MS.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import redis

from delayq.kube import naming
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.events import NORMAL, WARNING, TopicEvent
from delayq.kube.failover import Decision
from delayq.kube.master_endpoint import publish_master
from delayq.kube.redisctl import CatchUpTimeout
from delayq.kube.spec import TopicSpec


async def switch_over(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    decision: Decision,
    addresses: Mapping[str, str | None],
    uids: Mapping[str, str],
    replicas: tuple[str, ...],
    password: str,
    logger: Logger,
) -> tuple[Decision, TopicEvent]:
    """Carry out a switchover decision; returns the decision that holds afterwards (the old
    master kept when the replica did not catch up) and the Event telling what happened."""
    old, new = decision.switch_from, decision.master
    old_address, new_address = addresses.get(old or ""), addresses.get(new or "")
    if old is None or new is None or not old_address or not new_address:
        raise ValueError(f"not a switchover between reachable pods: {decision}")
    started = time.monotonic()
    try:
        offset = await ctx.redis.hand_over(old_address, new_address, password)
    except CatchUpTimeout as error:
        logger.warning("broker %d: switchover from %s deferred: %s", broker, old, error)
        kept = Decision(master=old, reason="SwitchoverDeferred", message=str(error))
        return kept, TopicEvent(
            WARNING,
            "SwitchoverDeferred",
            f"Broker {broker}: {old} is stopping, but {new} did not catch up ({error}); {old} "
            "took writes again and the switchover is tried on the next pass.",
        )
    # the target is ready by choice (failover._switch_target)
    await publish_master(ctx, owner, spec, broker, new, uids[new], new_address, ready=True)
    try:
        await ctx.redis.release(old_address, password)
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:  # its pause ends by itself
        logger.warning("broker %d: could not release %s after switching: %r", broker, old, error)
    paused_s = time.monotonic() - started
    ctx.metrics.switchovers.labels(spec.namespace, spec.name).inc()
    ctx.metrics.switchover_pause_seconds.observe(paused_s)
    master_host = naming.redis_master_host(spec.name, spec.namespace, broker)
    for name in replicas:
        if (address := addresses.get(name)) and name not in (old, new):
            await ctx.redis.demote(address, password, master_host)
    logger.warning(
        "broker %d: switched over from %s to %s at offset %d, writes paused %.0f ms",
        broker,
        old,
        new,
        offset,
        paused_s * 1000,
    )
    done = dataclasses.replace(decision, message=f"{new} is master")
    return done, TopicEvent(
        NORMAL,
        "SwitchedOver",
        f"Broker {broker}: {old} is stopping; {new} took over as master at replication offset "
        f"{offset}, writes paused {paused_s * 1000:.0f} ms.",
    )
