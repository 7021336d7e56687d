"""Pure builders of script calls and parsers of their replies, shared by the sync and async clients.

A `Plan` is the list of script calls one API operation needs (one per slot touched) and the
function that turns their raw replies into typed results. The clients only execute plans, so
the two flavours cannot drift apart and everything here is unit-testable without Redis.

This module holds what every plan shares (the types, grouping items into per-slot calls and
scattering the results back, the one reply parser `groups`); the plans themselves are in one
module per kind: `produce_plans`, `consume_plans`, `dead_plans`, `read_plans` and
`schedule_plans`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from delayq.queue.codes import Code, raise_for_code
from delayq.queue.model import Outcome, State
from delayq.queue.scripts import Script
from delayq.queue.topic import Topic

T = TypeVar("T")
Arg = str | bytes | int
Reply = Any  # what redis-py returns for a script: nested lists of bytes and ints

CODES = {code.value: code for code in Code}  # faster than Code(n) per message
STATES = {state.value.encode(): state for state in State}
MAX_MESSAGES_PER_CALL = 1000  # keeps any one script call short, so Redis never stalls on a batch
SLOTS_PER_CALL = 64  # slots a read-only call (stats-3, overview-4) reads: ~0.5 ms of Redis


@dataclass(frozen=True)
class ScriptCall:
    script: Script
    keys: list[str]
    args: list[Arg]


@dataclass(frozen=True)
class Plan(Generic[T]):
    """`partial`: the calls are independent (schedule's per-slot chunks), so `combine` gets a
    failed call's exception in place of its reply and reports which items were stored; any
    other plan's replies are raised at the first error."""

    calls: list[ScriptCall]
    combine: Callable[[list[Reply]], T]
    partial: bool = False


def optional_ms(value: int) -> int | None:
    return None if value < 0 else int(value)


def groups(reply: Reply, stride: int, head: int = 0) -> Iterator[tuple[Any, ...]]:
    """The per-message groups of a flat script reply: after `head` leading values, one tuple of
    `stride` values per message or row (every list reply has this one shape, lua/includes/
    append.lua)."""
    values = iter(reply[head:])
    return zip(*[values] * stride, strict=True)


def chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def per_slot_calls(
    topic: Topic,
    items: Sequence[T],
    slot_of: Callable[[T], int],
    build: Callable[[int, Sequence[T]], ScriptCall],
) -> tuple[list[ScriptCall], list[list[int]]]:
    """Group items by slot (one call per slot and chunk) and remember each item's position."""
    positions: dict[int, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        positions[slot_of(item)].append(index)
    calls: list[ScriptCall] = []
    order: list[list[int]] = []
    for slot, indexes in positions.items():
        for chunk in chunks(indexes, MAX_MESSAGES_PER_CALL):
            calls.append(build(slot, [items[i] for i in chunk]))
            order.append(list(chunk))
    return calls, order


def scatter(order: list[list[int]], per_call: list[list[T]], size: int) -> list[T]:
    """Put per-call results back in the order the caller gave the items."""
    results: list[T | None] = [None] * size
    for indexes, values in zip(order, per_call, strict=True):
        for index, value in zip(indexes, values, strict=True):
            results[index] = value
    return [r for r in results if r is not None]


def checked(plan: Plan[list[Outcome]], script: Script) -> Plan[Outcome]:
    """The single outcome of a one-message plan, raising the exception of a refusal code."""

    def combine(replies: list[Reply]) -> Outcome:
        outcome = plan.combine(replies)[0]
        raise_for_code(outcome.code, script.value, outcome.id)
        return outcome

    return Plan(plan.calls, combine)


def first(plan: Plan[list[T]]) -> Plan[T]:
    return Plan(plan.calls, lambda replies: plan.combine(replies)[0])
