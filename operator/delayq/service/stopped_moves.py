"""Finish (or roll back) slot moves, and finish doublings, whose mover stopped half-way, from
the slots' owner.

A mover killed in a step leaves its slot frozen (`moving:<epoch>`): nothing is delivered from it
and every write into it is refused until the move is completed or rolled back. A person may
take long to rerun `delayq routing move-slot`, so the process that owns the slot does it once
the slot has stayed frozen past `move_stall_s` (service.py): it runs the same `SlotMover` the
command runs, on a ZooKeeper session of its own, which resumes the recorded step; if that fails
(the target broker does not answer), it rolls the move back while the routing still names the
source (`SlotMover.abort`). A slot frozen with no move recorded was frozen by a doubling
(splitting.py) whose splitter stopped in `freeze` or `switch`: every old slot refuses writes
until it ends, so this process completes it with the same `SlotSplitter` the command runs
(`resume_frozen`), never rolls it back (the copy is done; a broker that fails the completion
fails a rollback too, both are tried again on a later retry), and never touches a doubling still
copying (it freezes nothing, no slot of it stalls).

Nothing lost, at every point (docs/coordination.md, "Moving a slot", "Doubling the slots"): each
takes its mover's lock (`movers/<slot>`, `movers/split`) first, so a mover still alive (or killed
less than a session ago) keeps it and this does nothing (`SlotLocked`, `SplitLocked`): of the
owners that see the stall at once, one wins the lock and the others find the doubling ended (or
held) on their next retry; every step is recorded before it is done and is
idempotent, so this process dying anywhere inside leaves the state a killed mover leaves: its
lock goes with its session, and the next owner (or the command) resumes the recorded step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis

from delayq.coordination.migration import Migration, MoveError, SlotLocked, SlotMover
from delayq.coordination.splitting import SlotSplitter, SplitLocked
from delayq.service.config import ServiceConfig
from delayq.service.routing_cli import connected

log = logging.getLogger(__name__)


def end_stopped_moves(config: ServiceConfig, slots: Iterable[int]) -> dict[int, str]:
    """Complete the move recorded for each of `slots`, or roll it back when it cannot be
    completed, and complete a doubling that froze the others; returns slot -> what was done,
    in words, for the slots with a recorded move or doubling (blocking: run it in a thread).
    One ZooKeeper session for all. Raises what ZooKeeper or Redis raise on connecting."""
    wanted = frozenset(slots)
    with connected(config) as (zk, paths, queues):
        mover = SlotMover(zk, paths, queues)
        done = {m.slot: _end(mover, m) for m in mover.migrations() if m.slot in wanted}
        if wanted - done.keys():
            ended = _end_split(SlotSplitter(zk, paths, queues))
            if ended is not None:
                done.update(dict.fromkeys(wanted - done.keys(), ended))
        return done


def _end_split(splitter: SlotSplitter) -> str | None:
    """Complete the doubling whose freeze began, if one is recorded; what was done in words,
    None when there was none."""
    try:
        split = splitter.resume_frozen()
    except SplitLocked as error:
        return f"left to its splitter: {error}"
    except (MoveError, redis.RedisError) as error:
        return f"doubling not completed now: {error}"
    if split is None:
        return None
    return f"doubling to {split.to_amount} slots completed"


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
