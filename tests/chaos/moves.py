"""Slot moves and a doubling under load, their process killed -9 inside a chosen step (issue 35).

`delayq routing move-slot` / `routing split` run as the operator runs them, in their own process,
reaching each broker through its own `Link` and ZooKeeper through a `ZkHold` (no hook in the
product), so the injector can hold them inside a step and kill them there:

* move `freeze`: the link to the source broker is frozen from the start: the move is recorded
  (`migrations/<slot>`, step freeze) and its freeze script waits;
* move `copy`: the link to the target broker is frozen: the slot is frozen and read, the copy's
  MULTI waits;
* move `switch` / `clean`: ZooKeeper passes nothing after the write recording that step (the
  routing still names the source / the source's keys are still there);
* doubling `copy`: ZooKeeper passes nothing after the split node records HOLD_COPIED old slots
  copied;
* doubling `freeze`: ZooKeeper holds it right after it recorded `freeze`; then the link to
  broker 1 is frozen and the hold released: it freezes and switches broker 0's old slots and
  waits on broker 1's.

The process is then killed with SIGKILL, its links are cut (what it had not sent is dropped, as
with a process that died before sending), and later the same command is run again, directly,
until the move or doubling is complete (the delay services may complete or roll it back
meanwhile: stopped_moves.py; a rolled-back move is simply moved again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from delayq.coordination.migration import Migration
from delayq.coordination.splitting import Split
from delayq.local.ports import free_port
from delayq.local.processes import config_env
from delayq.local.waiting import eventually
from tests.fleet.zk_hold import ZkHold

from .cluster import Cluster
from .proxy import Link

MOVE_STEPS = ("freeze", "copy", "switch", "clean")
SPLIT_STEPS = ("copy", "freeze")
HOLD_COPIED = 8  # old slots a doubling held in `copy` has copied
HOLD_TIMEOUT_S = 30.0
RESUME_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 30.0  # one run of the command


@dataclass
class Held:
    """A routing command held inside a step through its own links."""

    process: subprocess.Popen[bytes]
    links: list[Link]
    zk: ZkHold
    what: str

    async def kill(self) -> None:
        """SIGKILL, then cut its links: bytes it had sent but the link held are dropped."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        await asyncio.to_thread(self.process.wait)
        for link in self.links:
            link.cut()
            await link.close()
        self.zk.close()


def _env(cluster: Cluster, zk_port: int, redis_ports: list[int]) -> dict[str, str]:
    config = cluster.config("mover", zk_port, redis_ports, free_port())
    return {**os.environ, **config_env(config)}


def _spawn(cluster: Cluster, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (cluster.workdir / "routing.log").open("ab") as log:
        log.write(f"--- {time.time():.3f} delayq routing {' '.join(args)}\n".encode())
        log.flush()
        return subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "routing", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _held(
    cluster: Cluster,
    args: list[str],
    hold_after: Callable[[str, bytes], bool],
    frozen: set[int],
    what: str,
) -> Held:
    """`delayq routing <args>` through fresh links, those to the brokers in `frozen` frozen
    from the start, ZooKeeper holding it after the write `hold_after` matches."""
    links = [Link(broker.port) for broker in cluster.brokers]
    for index, link in enumerate(links):
        await link.start()
        if index in frozen:
            link.freeze()
    zk = ZkHold(("127.0.0.1", cluster.zookeeper.port), hold_after)
    env = _env(cluster, zk.port, [link.port for link in links])
    return Held(_spawn(cluster, args, env), links, zk, what)


def _polled(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """`condition` (blocking: ZooKeeper reads) in a thread, for `eventually`."""
    return lambda: asyncio.to_thread(condition)


def _node(cluster: Cluster, path: str) -> bytes | None:
    """The node's data, None when it is absent; KazooException (or a timeout) when ZooKeeper
    cannot tell now."""
    client = cluster.observer
    assert client is not None
    try:
        return bytes(client.get(path)[0])
    except NoNodeError:
        return None


UNREADABLE = (KazooException, KazooTimeoutError)  # asked again on the next poll


async def hold_move(cluster: Cluster, slot: int, target: int, step: str) -> Held:
    """A move of `slot` to broker `target` held inside `step` (module docstring)."""
    source = 1 - target
    migration = cluster.paths.migration(slot)

    def after(path: str, data: bytes) -> bool:
        return path == migration and Migration.decode(data).step.value == step

    frozen = {source} if step == "freeze" else {target} if step == "copy" else set()
    args = ["move-slot", "--slot", str(slot), "--to-broker", str(target)]
    held = await _held(cluster, args, after, frozen, f"move of slot {slot} in {step}")
    try:
        if step in ("switch", "clean"):
            await eventually(held.zk.held.is_set, HOLD_TIMEOUT_S, held.what, interval_s=0.05)
        else:

            def shown() -> bool:
                try:
                    found = _node(cluster, migration)
                except UNREADABLE:
                    return False
                return found is not None and Migration.decode(found).step.value == step

            await eventually(_polled(shown), HOLD_TIMEOUT_S, held.what, interval_s=0.05)
    except BaseException:
        await held.kill()
        raise
    return held


async def hold_split(cluster: Cluster, step: str) -> Held:
    """A doubling held inside `step` (module docstring)."""
    split = cluster.paths.split

    def after(path: str, data: bytes) -> bool:
        if path != split:
            return False
        recorded = Split.decode(data)
        if step == "copy":
            return recorded.step.value == "copy" and recorded.copied_slots == HOLD_COPIED
        return recorded.step.value == step

    args = ["split", "--to-slots", str(2 * cluster.slot_amount())]
    held = await _held(cluster, args, after, set(), f"doubling in {step}")
    try:
        await eventually(held.zk.held.is_set, HOLD_TIMEOUT_S, held.what, interval_s=0.05)
        if step == "freeze":
            # the freeze switches the old slots one at a time in slot order: with the link to
            # the broker that does not hold slot 0 frozen (a move may have taken slot 0 to
            # broker 1), it switches the first ones, then waits at the first slot over there
            first = await _broker_of_slot_0(cluster)
            held.links[1 - first].freeze()
            held.zk.release()
            switched = _polled(_switched_some(cluster))
            await eventually(switched, HOLD_TIMEOUT_S, "old slots switched", interval_s=0.05)
    except BaseException:
        await held.kill()
        raise
    return held


async def _broker_of_slot_0(cluster: Cluster) -> int:
    read: list[int] = []

    def routed() -> bool:
        routing = cluster.routing()
        if routing is not None:
            read.append(routing.broker_of_slot[0])
        return routing is not None

    await eventually(_polled(routed), HOLD_TIMEOUT_S, "the routing", interval_s=0.05)
    return read[-1]


def _switched_some(cluster: Cluster) -> Callable[[], bool]:
    def switched() -> bool:
        routing = cluster.routing()
        return routing is not None and bool(routing.doubled_slots)

    return switched


async def resume(cluster: Cluster, args: list[str], done: Callable[[], bool]) -> int:
    """Run `delayq routing <args>` directly until `done()`; returns how many runs it took."""
    env = _env(cluster, cluster.zookeeper.port, [broker.port for broker in cluster.brokers])
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    runs = 0
    while not await asyncio.to_thread(done):
        if time.monotonic() > deadline:
            raise TimeoutError(f"delayq routing {' '.join(args)} not done in {RESUME_TIMEOUT_S} s")
        runs += 1
        process = _spawn(cluster, args, env)
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), RUN_TIMEOUT_S)
        except TimeoutError:
            os.kill(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        if process.returncode != 0:  # locked by a service completing it, or by the dead one
            await asyncio.sleep(0.5)
    return runs


def move_done(cluster: Cluster, slot: int, target: int) -> Callable[[], bool]:
    """Routed to `target` and no move of the slot recorded."""

    def done() -> bool:
        routing = cluster.routing()
        try:
            recorded = _node(cluster, cluster.paths.migration(slot))
        except UNREADABLE:
            return False
        return routing is not None and routing.broker_of_slot[slot] == target and recorded is None

    return done


def split_done(cluster: Cluster, to_amount: int) -> Callable[[], bool]:
    """`to_amount` slots routed and no doubling recorded."""

    def done() -> bool:
        routing = cluster.routing()
        try:
            recorded = _node(cluster, cluster.paths.split)
        except UNREADABLE:
            return False
        return routing is not None and routing.slot_amount == to_amount and recorded is None

    return done


def slot_to_move(cluster: Cluster, member: str) -> tuple[int, int] | None:
    """(slot, its broker): the lowest slot `member` owns now, else the lowest slot anyone owns;
    None while ZooKeeper cannot be read or nobody owns one."""
    owners, routing = cluster.owners(), cluster.routing()
    if not owners or routing is None:
        return None
    slots = [s for s in sorted(owners) if s < routing.slot_amount]
    mine = [s for s in slots if owners[s] == member] or slots
    return (mine[0], routing.broker_of_slot[mine[0]]) if mine else None
