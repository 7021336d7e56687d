"""Finish (or roll back) slot moves whose mover stopped half-way, from the slots' owner.

A mover killed in a step leaves its slot frozen (`moving:<epoch>`): nothing is delivered from it
and every write into it is refused until the move is completed or rolled back. A person may
take long to rerun `delayq routing move-slot`, so the process that owns the slot does it once
the slot has stayed frozen past `move_stall_s` (service.py): it runs the same `SlotMover` the
command runs, on a ZooKeeper session of its own, which resumes the recorded step; if that fails
(the target broker does not answer), it rolls the move back while the routing still names the
source (`SlotMover.abort`). A slot frozen with no move recorded (a doubling, splitting.py) is
left to its own mover.

Nothing lost, at every point (docs/coordination.md, "Moving a slot"): both take the slot's lock
(`movers/<slot>`) first, so a mover still alive (or killed less than a session ago) keeps the
slot and this does nothing (`SlotLocked`); every step is recorded before it is done and is
idempotent, so this process dying anywhere inside leaves the state a killed mover leaves: its
lock goes with its session, and the next owner (or the command) resumes the recorded step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis

from delayq.coordination.migration import Migration, MoveError, SlotLocked, SlotMover
from delayq.service.config import ServiceConfig
from delayq.service.routing_cli import connected

log = logging.getLogger(__name__)


def end_stopped_moves(config: ServiceConfig, slots: Iterable[int]) -> dict[int, str]:
    """Complete the move recorded for each of `slots`, or roll it back when it cannot be
    completed; returns slot -> what was done, in words, for the slots with a recorded move
    (blocking: run it in a thread). One ZooKeeper session for all. Raises what ZooKeeper or
    Redis raise on connecting."""
    wanted = frozenset(slots)
    with connected(config) as (zk, paths, queues):
        mover = SlotMover(zk, paths, queues)
        return {m.slot: _end(mover, m) for m in mover.migrations() if m.slot in wanted}


def _end(mover: SlotMover, migration: Migration) -> str:
    slot, target = migration.slot, migration.target
    try:
        mover.move(slot, target)
        return f"move to broker {target} completed"
    except SlotLocked as error:
        return f"left to its mover: {error}"
    except (MoveError, redis.RedisError) as error:
        log.warning(
            "could not complete a stopped move; rolling it back",
            extra={"slot": slot, "error": str(error)},
        )
    try:
        mover.abort(slot)  # refused (MoveError) once the routing names the target
    except (MoveError, redis.RedisError) as error:
        return f"neither completed nor rolled back now: {error}"
    return f"move to broker {target} rolled back"
