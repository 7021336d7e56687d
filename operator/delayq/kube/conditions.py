"""Conditions the health pass derives from its observations: pure, one function per condition.

SlotsUnowned: a slot without an owner is normal for a moment (a delay-service pod restarts, a
rebalance hands slots over), so it turns True only once some slot has lacked an owner for
`after_s`. Once True it stays True until every slot is owned, also when a new leader (whose
timer starts afresh) takes over: the condition in the status is the memory that survives.

BrokerFull: a broker's master at or over its maxmemory refuses new messages (429, the memory
guard); from MEMORY_PRESSURE_RATIO of it on, the condition warns before that. The message names
each broker concerned with its figures in whole percent and MiB, so it (and the status) changes
only when a figure visibly moves.
"""

from __future__ import annotations

from collections.abc import Mapping

from delayq.kube.redisctl import BrokerMemory
from delayq.kube.status import BROKER_FULL, FALSE, SLOTS_UNOWNED, TRUE, Condition

SLOTS_UNOWNED_AFTER_S = 60.0
MEMORY_PRESSURE_RATIO = 0.9
MIB = 1024 * 1024


def slots_unowned_condition(
    previous: Condition | None,
    unowned: int,
    total: int,
    unowned_for_s: float,
    after_s: float = SLOTS_UNOWNED_AFTER_S,
) -> Condition:
    """`unowned_for_s`: how long some slot has lacked an owner without a break (0 if none)."""
    if unowned <= 0:
        return Condition(SLOTS_UNOWNED, FALSE, "AllSlotsOwned", "Every slot has an owner.")
    if unowned_for_s >= after_s or (previous is not None and previous.status == TRUE):
        return Condition(
            SLOTS_UNOWNED,
            TRUE,
            "SlotsUnowned",
            f"{unowned} of {total} slots have had no owner for over {after_s:g} s: their due "
            "messages are not delivered until a delay-service pod claims them.",
        )
    return Condition(
        SLOTS_UNOWNED,
        FALSE,
        "OwnersPending",
        f"{unowned} of {total} slots have no owner yet; this turns True after {after_s:g} s.",
    )


def broker_full_condition(memory: Mapping[int, BrokerMemory]) -> Condition | None:
    """From the memory of the brokers whose master answered; None when none did (the condition
    then keeps its last value: a failover or a partition says nothing about memory)."""
    if not memory:
        return None
    bounded = {b: m for b, m in sorted(memory.items()) if m.max_memory_bytes > 0}
    if not bounded:
        return Condition(
            BROKER_FULL,
            FALSE,
            "NoMaxMemory",
            "No broker has a maxmemory (its Redis pods have no memory limit): nothing refuses "
            "new messages before the node runs out of memory.",
        )
    full = [b for b, m in bounded.items() if m.used_memory_bytes >= m.max_memory_bytes]
    pressed = [b for b, m in bounded.items() if (m.used_ratio or 0) >= MEMORY_PRESSURE_RATIO]
    if full:
        return Condition(
            BROKER_FULL,
            TRUE,
            "BrokerFull",
            _figures(bounded, pressed)
            + ": at maxmemory, new messages are refused (HTTP 429) until deliveries free room.",
        )
    if pressed:
        return Condition(
            BROKER_FULL,
            TRUE,
            "MemoryPressure",
            _figures(bounded, pressed)
            + f": over {MEMORY_PRESSURE_RATIO:.0%} of maxmemory; at 100% new messages are refused.",
        )
    return Condition(
        BROKER_FULL,
        FALSE,
        "MemoryAvailable",
        f"Every broker's master is below {MEMORY_PRESSURE_RATIO:.0%} of its maxmemory.",
    )


def _figures(memory: Mapping[int, BrokerMemory], brokers: list[int]) -> str:
    """`broker 0 uses 96% of maxmemory (393 of 410 MiB); broker 1 ...`"""
    return "; ".join(
        f"broker {b} uses {int((memory[b].used_ratio or 0) * 100)}% of maxmemory "
        f"({memory[b].used_memory_bytes // MIB} of {memory[b].max_memory_bytes // MIB} MiB)"
        for b in brokers
    )
