"""Finish (or roll back) a slot move whose mover stopped half-way, from the slot's owner.

A mover killed in a step leaves its slot frozen (`moving:<epoch>`): nothing is delivered from it
and every write into it is refused until the move is completed or rolled back. A person may
take long to rerun `delayq routing move-slot`, so the process that owns the slot does it once
the slot has stayed frozen past `move_stall_s` (service.py): it runs the same `SlotMover` the
command runs, on a ZooKeeper session of its own, which resumes the recorded step; if that fails
(the target broker does not answer), it rolls the move back while the routing still names the
source (`SlotMover.abort`).

Nothing lost, at every point (docs/coordination.md, "Moving a slot"): both take the slot's lock
(`movers/<slot>`) first, so a mover still alive (or killed less than a session ago) keeps the
slot and this does nothing (`SlotLocked`); every step is recorded before it is done and is
idempotent, so this process dying anywhere inside leaves the state a killed mover leaves: its
lock goes with its session, and the next owner (or the command) resumes the recorded step.
"""

from __future__ import annotations

import logging

import redis

from delayq.coordination.migration import MoveError, SlotLocked, SlotMover
from delayq.service.config import ServiceConfig
from delayq.service.routing_cli import connected

log = logging.getLogger(__name__)


def end_stopped_move(config: ServiceConfig, slot: int) -> str:
    """Complete the move recorded for `slot`, or roll it back when it cannot be completed;
    returns what was done, in words (blocking: run it in a thread). Raises what ZooKeeper or
    Redis raise, MoveError when neither is possible now; SlotLocked while a mover holds the
    slot."""
    with connected(config) as (zk, paths, queues):
        mover = SlotMover(zk, paths, queues)
        recorded = [m for m in mover.migrations() if m.slot == slot]
        if not recorded:
            return "no move recorded"
        migration = recorded[0]
        try:
            mover.move(slot, migration.target)
            return f"move to broker {migration.target} completed"
        except SlotLocked:
            raise
        except (MoveError, redis.RedisError) as error:
            log.warning(
                "could not complete a stopped move; rolling it back",
                extra={"slot": slot, "error": str(error)},
            )
        mover.abort(slot)  # refused (MoveError) once the routing names the target
        return f"move to broker {migration.target} rolled back"
