"""The fault menu, the seeded plan of overlapping faults, and their injection.

A plan is pure (seed -> list of `FaultSpec`): every kind of the menu at least once in a random
order, then random extra faults until the fault phase is full. Faults overlap (the next one
starts before the previous one ends) but never two on the same target at once, and at most
`MAX_CONCURRENT` run together, so the fleet always has someone left to fail over to. Then the
takeovers judged alone (`ISOLATED`): a kill -9 and a SIGSTOP past the session timeout but
shorter than the lease, each of a process with many POSTs in flight, each followed by a quiet
time: among overlapping faults one fault's recovery bound always reaches into the next, which
leaves the takeover rules nothing to judge. Then, one at a time, slot moves between the two
brokers and a doubling, each killed -9 inside a chosen step while a serve process is killed too,
then completed (moves.py). Each injection is bounded and returns the `Window`
it really covered, on the real wall clock in ms, which is what the checker explains duplicates
and stalls with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import redis.asyncio

from delayq.local.waiting import eventually

from . import moves
from .cluster import ACK_TIMEOUT_MS, GRACE_MS, SESSION_TIMEOUT_MS, Cluster, Member
from .probes import fleet_ready
from .proxy import Link
from .receiver import Behaviour, Recipient

MAX_CONCURRENT = 2
RESTART_WAIT_S = 60.0

# kind -> (duration range in s, target kind). Durations: how long the fault lasts (an outage,
# a freeze, a cut) or how long a killed process stays down before its restart.
MENU: dict[str, tuple[tuple[float, float], str]] = {
    "serve_kill9": ((0.5, 3.0), "serve"),
    "serve_sigterm": ((0.5, 2.0), "serve"),
    "serve_sigstop": ((1.0, 7.0), "serve"),  # beyond 4 s the ZooKeeper session expires
    "serve_cut_all": ((2.0, 7.0), "serve"),
    "serve_cut_zk": ((2.0, 7.0), "serve"),
    "redis_kill9": ((0.5, 2.0), "redis"),
    "redis_pause": ((1.0, 3.0), "redis"),
    "redis_sleep": ((1.0, 3.0), "redis"),
    "redis_full": ((2.0, 5.0), "redis"),
    "zk_kill9": ((0.5, 2.0), "zk"),
    "zk_sigstop": ((1.0, 6.0), "zk"),
    "receiver_slow": ((3.0, 8.0), "receiver"),
    "receiver_5xx": ((1.0, 4.0), "receiver"),
}
KINDS = tuple(MENU)
# the moves' faults (moves.py), planned after the isolated takeovers, one at a time: a slot move
# between the two brokers (mode: the step its mover is killed in) and the doubling (mode: the
# step its splitter is killed in), each while a serve process (`victim`) is killed -9
MOVE_KILL, SPLIT_KILL = "move_kill9", "split_kill9"
MOVER = "mover"  # their target: one at a time
# faults that may cost an in-flight delivery its ack (so explain a duplicate or a skipped
# attempt); a graceful SIGTERM and 5xx answers must not
LOSSY = frozenset({*KINDS, MOVE_KILL, SPLIT_KILL}) - {"serve_sigterm", "receiver_5xx"}
SERVES = ("c0", "c1", "c2")
# kind -> duration range in s of the takeovers judged alone, each in mode "loaded": the receiver
# holds the target's POSTs for LOADED_S (HELD_S each, past the fault's start) before the fault,
# so the takeover has that many seconds' worth of leases to roll back
ISOLATED: dict[str, tuple[float, float]] = {
    "serve_kill9": (0.5, 3.0),
    "serve_sigstop": (SESSION_TIMEOUT_MS / 1000 + 1, ACK_TIMEOUT_MS / 1000 - 3),
}
LOADED = "loaded"
LOADED_S = 1.5
HELD_S = 3.0
QUIET_S = SESSION_TIMEOUT_MS / 1000 + 2 + 3  # the recovery bound, then 3 s to judge
VICTIM_DOWN_S = (0.5, 2.0)  # how long the serve process killed with a mover stays down
# what a move's (a doubling's) fault takes, a restart and a rerun included: the plan's estimate
MOVE_S, SPLIT_S = 10.0, 15.0
TARGETS = (*SERVES, "redis", "zk", "receiver", MOVER)


@dataclass(frozen=True)
class FaultSpec:
    at_s: float  # offset from the start of the fault phase
    kind: str
    target: str  # c0..c2, redis, zk, receiver
    duration_s: float
    mode: str = ""  # serve_cut_*: "freeze" (silence) or "reset" (connections closed); LOADED;
    # MOVE_KILL / SPLIT_KILL: the step the mover is killed in
    victim: str = ""  # MOVE_KILL / SPLIT_KILL: the serve process killed meanwhile


@dataclass(frozen=True)
class Window:
    """When a fault really was active (wall ms), as the injector measured it."""

    kind: str
    target: str
    start_ms: float
    end_ms: float
    mode: str = ""


def plan(
    seed: int,
    phase_s: float,
    kinds: tuple[str, ...] = KINDS,
    moves: tuple[str, ...] = (),
    split: str = "",
) -> list[FaultSpec]:
    """Seeded faults for a phase of about `phase_s` seconds: overlapping ones (each of `kinds`
    once, those of ISOLATED excepted, then extras; among them a move killed in each step of
    `moves`, then a doubling killed in `split` if given), then the isolated takeovers of
    `kinds` (which the injector starts only QUIET_S after everything before them ended)."""
    rng = random.Random(seed)
    alone = [kind for kind in ISOLATED if kind in kinds]
    budget_s = sum(LOADED_S + ISOLATED[kind][1] + QUIET_S for kind in alone)
    specs = _overlapping(rng, phase_s - budget_s, kinds, [k for k in kinds if k not in alone])
    specs += _moves(rng, moves, split)
    return specs + _isolated(rng, specs, alone)


def _moves(rng: random.Random, moves: tuple[str, ...], split: str) -> list[FaultSpec]:
    """The moves, then the doubling, from the start of the phase on, among the overlapping
    faults; each waits for the one before it (their target, MOVER, is one lock) whatever it
    really took."""
    cursor = 1.0
    steps = [(MOVE_KILL, step, MOVE_S) for step in moves]
    steps += [(SPLIT_KILL, split, SPLIT_S)] if split else []
    specs: list[FaultSpec] = []
    for kind, step, estimate_s in steps:
        down_s = round(rng.uniform(*VICTIM_DOWN_S), 2)
        specs.append(FaultSpec(round(cursor, 2), kind, MOVER, down_s, step, rng.choice(SERVES)))
        cursor += estimate_s
    return specs


def _overlapping(
    rng: random.Random, phase_s: float, kinds: tuple[str, ...], order: list[str]
) -> list[FaultSpec]:
    """Each of `order` once in a random order, then extras of `kinds` until `phase_s`."""
    rng.shuffle(order)
    busy_until: dict[str, float] = {}
    running: list[float] = []  # end times of planned faults
    specs: list[FaultSpec] = []
    cursor = 1.0
    while True:
        required = len(specs) < len(order)
        kind = order[len(specs)] if required else rng.choice(kinds)
        (low, high), target_kind = MENU[kind]
        duration = round(rng.uniform(low, high), 2)
        targets = SERVES if target_kind == "serve" else (target_kind,)
        target = min(targets, key=lambda t: (busy_until.get(t, 0.0), rng.random()))
        start = max(cursor, busy_until.get(target, 0.0))
        running = [end for end in running if end > start]
        if len(running) >= MAX_CONCURRENT:
            start = max(start, min(running))
        if not required and start + duration > phase_s:
            return sorted(specs, key=lambda s: s.at_s)
        mode = rng.choice(("freeze", "reset")) if kind.startswith("serve_cut") else ""
        specs.append(FaultSpec(round(start, 2), kind, target, duration, mode))
        end = start + duration + recovery_s(kind)
        busy_until[target] = end
        running.append(end)
        cursor = start + rng.uniform(0.3, 1.0) * duration


def _isolated(rng: random.Random, before: list[FaultSpec], kinds: list[str]) -> list[FaultSpec]:
    """`kinds` one at a time, QUIET_S after everything before them and after each other (as
    planned; the injector waits for what really took longer)."""
    ends = (s.at_s + s.duration_s + max(recovery_s(s.kind), QUIET_S) for s in before)
    cursor = max(ends, default=QUIET_S)
    specs: list[FaultSpec] = []
    for kind in kinds:
        duration = round(rng.uniform(*ISOLATED[kind]), 2)
        specs.append(FaultSpec(round(cursor, 2), kind, rng.choice(SERVES), duration, LOADED))
        cursor += LOADED_S + duration + max(recovery_s(kind), QUIET_S)
    return specs


def recovery_s(kind: str) -> float:
    """Time a target needs after a fault before the next one on it makes sense."""
    return {"serve_kill9": 6.0, "serve_sigterm": 6.0, "zk_kill9": 8.0, "redis_kill9": 2.0}.get(
        kind, 1.0
    )


def wall_ms() -> float:
    return time.time() * 1000


@dataclass
class Injector:
    cluster: Cluster
    receiver: Recipient
    windows: list[Window]
    notes: list[str]
    locks: dict[str, asyncio.Lock] = field(
        default_factory=lambda: {target: asyncio.Lock() for target in TARGETS}
    )
    restarts: list[asyncio.Task[None]] = field(default_factory=list)  # the moves' victims'

    async def run(self, specs: list[FaultSpec]) -> None:
        """Inject every spec at its time (an isolated takeover, mode LOADED, no earlier than
        QUIET_S after every spec before it was restored); returns when all are restored."""
        started = time.monotonic()
        over = [asyncio.Event() for _ in specs]

        async def one(index: int, spec: FaultSpec) -> None:
            await asyncio.sleep(max(0.0, started + spec.at_s - time.monotonic()))
            if spec.mode == LOADED:
                await asyncio.gather(*(event.wait() for event in over[:index]))
                await asyncio.gather(*self.restarts)  # victims of the moves' faults
                quiet_until_ms = max((w.end_ms for w in self.windows), default=0.0)
                await asyncio.sleep(max(0.0, quiet_until_ms / 1000 + QUIET_S - wall_ms() / 1000))
            async with self.locks[spec.target]:
                begun = wall_ms()
                try:
                    ended = await self.inject(spec)
                except Exception as error:  # a harness problem: record it, keep going
                    self.notes.append(f"{spec}: {type(error).__name__}: {error}")
                    ended = wall_ms()
                self.windows.append(Window(spec.kind, spec.target, begun, ended, spec.mode))
            over[index].set()

        await asyncio.gather(*(one(index, spec) for index, spec in enumerate(specs)))
        await asyncio.gather(*self.restarts)

    async def inject(self, spec: FaultSpec) -> float:
        """Apply one fault for its duration and undo it; returns when it was restored (ms)."""
        handler: Callable[[FaultSpec], Awaitable[float]] = getattr(self, spec.kind)
        return await handler(spec)

    # serve processes --------------------------------------------------------------------------

    def _member(self, spec: FaultSpec) -> Member:
        return self.cluster.member(spec.target)

    async def serve_kill9(self, spec: FaultSpec) -> float:
        member = self._member(spec)
        await self._hold_posts(spec)
        member.held_down = True
        await asyncio.to_thread(member.serve.kill)
        if spec.mode == LOADED:
            self.receiver.behaviour = Behaviour()
        await asyncio.sleep(spec.duration_s)
        return await self._restart(member)

    async def move_kill9(self, spec: FaultSpec) -> float:
        """A move of a slot `spec.victim` owns to the other broker, its mover killed -9 inside
        step `spec.mode` together with the victim; the move is run again until complete
        (moves.py) while the victim restarts after `spec.duration_s` (its own window: the next
        move need not wait for it)."""
        where: list[tuple[int, int]] = []

        async def hold() -> moves.Held:
            found = await eventually(
                functools.partial(asyncio.to_thread, moves.slot_to_move, self.cluster, spec.victim),
                RESTART_WAIT_S,
                "a slot to move",
                interval_s=0.2,
            )
            where.append(found)
            return await moves.hold_move(self.cluster, found[0], 1 - found[1], spec.mode)

        held, victim_back = await self._kill_with(hold, spec)
        self.restarts.append(victim_back)
        slot, source = where[0]
        done = moves.move_done(self.cluster, slot, 1 - source)
        args = ["move-slot", "--slot", str(slot), "--to-broker", str(1 - source)]
        runs = await moves.resume(self.cluster, args, done)
        self.notes.append(f"{held.what}: killed with {spec.victim}, completed after {runs} runs")
        return wall_ms()

    async def split_kill9(self, spec: FaultSpec) -> float:
        """The doubling, its splitter killed -9 inside step `spec.mode` together with
        `spec.victim`; then run again until complete (moves.py), and every process (the victim
        too) serving the doubled slots."""
        to_amount = 2 * await asyncio.to_thread(self.cluster.slot_amount)
        held, victim_back = await self._kill_with(
            functools.partial(moves.hold_split, self.cluster, spec.mode), spec
        )
        done = moves.split_done(self.cluster, to_amount)
        runs = await moves.resume(self.cluster, ["split", "--to-slots", str(to_amount)], done)
        completed = time.monotonic()
        await victim_back
        # every service restarts on the new slots (leaves and joins again): the fault is
        # restored once the fleet serves them all, which the note times
        async with aiohttp.ClientSession() as session:
            ready = functools.partial(fleet_ready, self.cluster, session)
            await eventually(ready, RESTART_WAIT_S, "the doubled fleet", interval_s=0.2)
        self.notes.append(
            f"{held.what}: killed with {spec.victim}, completed after {runs} runs; every "
            f"process serving the {to_amount} slots {time.monotonic() - completed:.1f} s later"
        )
        return wall_ms()

    async def _kill_with(
        self, hold: Callable[[], Awaitable[moves.Held]], spec: FaultSpec
    ) -> tuple[moves.Held, asyncio.Task[None]]:
        """Hold a routing command in its step (`hold`) and kill it and the victim at once;
        returns it and the victim's restart, `spec.duration_s` later, which records the
        victim's own window (serve_kill9) once it listens. Meanwhile no other fault touches
        the victim; none touches Redis or ZooKeeper while the command is held (it would fail
        there instead of being killed in its step)."""
        victim = self.cluster.member(spec.victim)
        await self.locks[victim.name].acquire()
        try:
            async with self.locks["redis"], self.locks["zk"]:
                held = await hold()
                victim.held_down = True
                begun = wall_ms()
                await asyncio.gather(held.kill(), asyncio.to_thread(victim.serve.kill))
        except BaseException:
            self.locks[victim.name].release()
            raise

        async def back() -> None:
            try:
                await asyncio.sleep(spec.duration_s)
                restored = await self._restart(victim)
                self.windows.append(Window("serve_kill9", victim.name, begun, restored))
            finally:
                self.locks[victim.name].release()

        return held, asyncio.create_task(back())

    async def serve_sigterm(self, spec: FaultSpec) -> float:
        member = self._member(spec)
        member.held_down = True
        member.serve.terminate()
        code = await asyncio.to_thread(member.serve.wait, GRACE_MS / 1000 + 15)
        if code != 0:
            self.notes.append(f"{member.name} exited {code} after SIGTERM")
        await asyncio.sleep(spec.duration_s)
        return await self._restart(member)

    async def _hold_posts(self, spec: FaultSpec) -> None:
        """Mode LOADED: the receiver holds the target's POSTs for LOADED_S before the fault (the
        caller restores the receiver once the fault hit), so it strands that many leases."""
        if spec.mode == LOADED:
            held = Behaviour(slow_s=(HELD_S, HELD_S), only=frozenset({spec.target}))
            self.receiver.behaviour = held
            await asyncio.sleep(LOADED_S)

    async def _restart(self, member: Member) -> float:
        """Start it again; the fault is restored once it listens again (it joins ZooKeeper
        first): a restart under load spends seconds starting up, still down meanwhile."""
        member.serve.start()
        member.held_down = False
        await _listening(member.url, RESTART_WAIT_S)
        return wall_ms()

    async def serve_sigstop(self, spec: FaultSpec) -> float:
        member = self._member(spec)
        await self._hold_posts(spec)
        member.held_down = True  # a stopped process is not an exited one, but be explicit
        member.signal(signal.SIGSTOP)
        self.receiver.behaviour = Behaviour()
        try:
            await asyncio.sleep(spec.duration_s)
        finally:
            member.signal(signal.SIGCONT)
            member.held_down = False
        return wall_ms()

    async def serve_cut_all(self, spec: FaultSpec) -> float:
        member = self._member(spec)
        return await self._cut(spec, (member.zk_link, *member.redis_links))

    async def serve_cut_zk(self, spec: FaultSpec) -> float:
        return await self._cut(spec, (self._member(spec).zk_link,))

    async def _cut(self, spec: FaultSpec, links: tuple[Link, ...]) -> float:
        for link in links:
            if spec.mode == "freeze":
                link.freeze()
            else:
                link.cut()
        try:
            await asyncio.sleep(spec.duration_s)
        finally:
            for link in links:
                link.restore()
        return wall_ms()

    # redis-server -----------------------------------------------------------------------------

    def _control(self) -> redis.asyncio.Redis:
        """A fresh direct connection (not through a link): an old one may predate a crash."""
        return redis.asyncio.Redis(port=self.cluster.redis.port, socket_timeout=30)

    async def redis_kill9(self, spec: FaultSpec) -> float:
        self.cluster.redis.crash()
        await asyncio.sleep(spec.duration_s)
        await asyncio.to_thread(self.cluster.redis.start)  # replays the AOF, answers PING
        return wall_ms()

    async def redis_pause(self, spec: FaultSpec) -> float:
        client = self._control()
        try:
            await client.client_pause(int(spec.duration_s * 1000), all=True)
            await asyncio.sleep(spec.duration_s)
            await _answers(client)  # PING is paused too: returns once the pause is over
        finally:
            await client.aclose()
        return wall_ms()

    async def redis_sleep(self, spec: FaultSpec) -> float:
        client = self._control()  # DEBUG SLEEP blocks the whole server, this connection too
        try:
            await client.execute_command("DEBUG", "SLEEP", spec.duration_s)
        finally:
            await client.aclose()
        return wall_ms()

    async def redis_full(self, spec: FaultSpec) -> float:
        """maxmemory under the current use, noeviction: every write is refused with OOM."""
        client = self._control()
        try:
            used = int((await client.info("memory"))["used_memory"])
            await client.config_set("maxmemory-policy", "noeviction")
            await client.config_set("maxmemory", max(1024 * 1024, used // 2))
            try:
                await asyncio.sleep(spec.duration_s)
            finally:
                await client.config_set("maxmemory", 0)
        finally:
            await client.aclose()
        return wall_ms()

    # ZooKeeper --------------------------------------------------------------------------------

    async def zk_kill9(self, spec: FaultSpec) -> float:
        server = self.cluster.zookeeper
        if server.process is not None:
            server.process.kill()
            await asyncio.to_thread(server.process.wait)
        await asyncio.sleep(spec.duration_s)
        await asyncio.to_thread(server.start)  # same port and data; waits for imok
        return wall_ms()

    async def zk_sigstop(self, spec: FaultSpec) -> float:
        process = self.cluster.zookeeper.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(spec.duration_s)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        return wall_ms()

    # the receiver -----------------------------------------------------------------------------

    async def receiver_slow(self, spec: FaultSpec) -> float:
        return await self._behave(spec, Behaviour(slow_s=(0.4, 3.0)))

    async def receiver_5xx(self, spec: FaultSpec) -> float:
        return await self._behave(spec, Behaviour(error_rate=0.8))

    async def _behave(self, spec: FaultSpec, behaviour: Behaviour) -> float:
        self.receiver.behaviour = behaviour
        try:
            await asyncio.sleep(spec.duration_s)
        finally:
            self.receiver.behaviour = Behaviour()
        return wall_ms()


async def _listening(url: str, timeout_s: float) -> None:
    """Until GET /healthz answers 200, at most `timeout_s` (then the checker judges a process
    that never came back; the supervisor may restart it meanwhile)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                timeout = aiohttp.ClientTimeout(total=1.0)
                async with session.get(url + "/healthz", timeout=timeout) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)


async def _answers(client: redis.asyncio.Redis) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if await client.ping():
                return
        await asyncio.sleep(0.05)
