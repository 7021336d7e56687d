"""The slots one process consumes on one broker: ownership under fencing epochs, and wake-ups.

The push `Consumer` and the service's pull delivery need the same two things and must get them
exactly right, so they share this one core:

* **Ownership.** Taking a slot over bumps its fencing epoch on the broker
  (`AsyncQueue.take_over`); every claim carries the epoch its slot was owned under. A claim
  refused as stale means a newer owner fenced this one out: the slot is dropped (`lose`), but
  only if it is still the same ownership (a release and re-own meanwhile drew a new epoch and a
  new `OwnedSlot` object, so identity, not the slot number, says which ownership a reply is for).
* **Wake-ups.** A producer scheduling a slot's new earliest message pushes its due time to the
  slot's `wake` list inside the schedule script (lua/includes/wake_at.lua). One blocking BLPOP
  per broker over the wake lists of all owned slots, plus a private control key pushed to
  interrupt the wait when the set of slots changes or on close, turns those pushes into
  `due_at(slot, due_ms)` calls: the owner times its claim for that instant rather than claim
  at once. An idle slot therefore costs one key
  in one blocking call and no polling. A wake-up popped for a slot released while the wait was
  blocked goes back to its list, for the slot's new owner. A failed wait (Redis restarting) may
  have eaten a wake-up whose reply died with the connection, so then every owned slot is reported
  (at most once a second) rather than waiting for a watchdog.

Ownership changes never depend on Redis: interrupting the wait is best effort (a wait that keeps
listening on a released slot hands its wake-ups back, and ends by itself within `WAKE_BLOCK_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import redis.asyncio

from delayq.queue import settings
from delayq.queue.client import AsyncQueue
from delayq.queue.codec import as_text
from delayq.queue.codes import SlotMovingError
from delayq.queue.keys import Part, control_key, parse_wake_key, slot_keys
from delayq.queue.slot_split import FROZEN

log = logging.getLogger(__name__)

#: Upper bound of one blocking wait (a liveness refresh, not a poll): half the shortest ZooKeeper
#: session a topic may have. Redis hands a wake-up to the client blocked on the list longest,
#: and a process frozen or cut off keeps its wait registered until this runs out on the server:
#: a wait of 10 s outlived its session, and took the first wake-up of a slot the new owner had
#: taken over, which then waited for the new owner's watchdog (tests/queue/
#: test_consumer_faults.py). ZooKeeper expires a session 2/3 of its timeout after the process
#: stopped at the soonest (the client pings every third of it), so a wait of half the shortest
#: one has ended on the server before any takeover.
WAKE_BLOCK_S = settings.by_name("zookeeper_session_timeout_ms").low / 1000 / 2
WAIT_FAILED_ALL_S = 1.0  # after a failed wait, every owned slot is reported at most this often
WAIT_RETRY_S = 0.1  # pause before waiting again after a failed wait
CLOSE_WAIT_S = 2.0  # how long closing waits for the blocking wait to take its interrupt


@dataclass(eq=False)
class OwnedSlot:
    """One ownership of one slot: the epoch its take-over drew, and the wake-ups received since
    (a wake-up arriving while a claim is in flight makes that claim's next due time stale)."""

    slot: int
    epoch: int
    wakes: int = 0


S = TypeVar("S", bound=OwnedSlot)


class OwnedSlots(Generic[S]):
    """The slots owned on one broker, each as an `S` made by `new_slot(slot, epoch)` (callers
    extend `OwnedSlot` with their own per-slot state), and the one blocking wait over their wake
    lists. `due_at(state, due_ms)` is called whenever a slot may have something due at
    `due_ms` (the broker's clock; 0: now): when it is owned (it may hold a backlog, 0), and when
    a producer wakes it (the due time its wake-up holds: `due_of`)."""

    def __init__(
        self,
        queue: AsyncQueue,
        new_slot: Callable[[int, int], S],
        due_at: Callable[[S, float], None],
    ) -> None:
        self.queue = queue
        self._new_slot = new_slot
        self._due_at = due_at
        self._slots: dict[int, S] = {}
        self._control_key = control_key(queue.topic, uuid.uuid4().hex)
        # the wait's command, packed once for the slots it was made for (`_WaitCommand`)
        self._command = _WaitCommand(self._control_key, (), [])
        self._first = 0  # where in `_command`'s slots the next wait's keys begin (fairness)
        self._waker = _blocking_client(queue.redis, WAKE_BLOCK_S)
        self._waiting: asyncio.Task[None] | None = None
        self._closing = False
        self._handing: set[asyncio.Task[None]] = set()  # wake-ups going back (`lose`, `release`)

    def get(self, slot: int) -> S | None:
        return self._slots.get(slot)

    def __iter__(self) -> Iterator[S]:
        return iter(list(self._slots.values()))

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> list[int]:
        return sorted(self._slots)

    async def own(self, slots: Iterable[int]) -> dict[int, redis.RedisError | OSError]:
        """Take over the slots not owned yet, all in one round trip (a rejoin hands a process
        a third of the slots at once: one round trip each left the last ones unconsumed for
        as many round trips), each reported to `due_at` (due now) as soon as it is owned. A slot
        that cannot be taken now never keeps the others from being taken: the slots refused
        as moving (SlotMovingError, frozen by a move) are skipped and returned with their
        error; after a failure of the broker itself (it does not answer), every slot is
        returned with it. The caller retries the returned slots."""
        failed: dict[int, redis.RedisError | OSError] = {}
        pending = [slot for slot in dict.fromkeys(slots) if slot not in self._slots]
        if not pending:
            return failed
        try:
            try:
                epochs = await self.queue.take_over_slots(pending)
            except SlotMovingError as error:  # a single call raises its refusal
                epochs = [error]
            except (redis.RedisError, OSError) as error:
                return dict.fromkeys(pending, error)
            for slot, epoch in zip(pending, epochs, strict=True):
                if isinstance(epoch, (redis.RedisError, OSError)):
                    failed[slot] = epoch
                elif isinstance(epoch, Exception):
                    raise epoch
                else:
                    state = self._new_slot(slot, epoch)
                    self._slots[slot] = state
                    self._due_at(state, 0)
        finally:
            await self.interrupt()  # the wait picks up the new slots' wake lists
        return failed

    async def release(self, slots: Iterable[int], hand_back: bool = False) -> set[int]:
        """Stop owning the slots; returns those that were owned. Never raises. With `hand_back`,
        a released slot whose wait took a wake-up (`wakes`) gets one back on its list, as a lost
        one does (`lose`): a process frozen past its session keeps its wait blocked on its
        slots' lists and is served first, so it may take the new owner's wake-up, read it on
        waking while it still counts the slot its own, and then release every slot (its session
        was lost) before claiming (chaos soak seed 1010, pull: a message 1.7 s late,
        docs/reliability.md). The push `Consumer`, which counts its claims, hands back only
        the wake-ups no claim covers (`drop` with its own `woken`). A wake-up too many costs
        the new owner one claim."""
        released = self.drop(slots, _ever_woken if hand_back else None)
        if released:
            await self.interrupt()
        return released

    def drop(self, slots: Iterable[int], woken: Callable[[S], bool] | None = None) -> set[int]:
        """`release` up to the wait's interrupt, which the caller sends (`interrupt`): from
        now on nothing of the slots is held (`get` answers None). A dropped slot whose state
        `woken` says its wait took a wake-up the owner has not acted on gets one back on its
        list, as in `release(hand_back=True)`, by the caller's own measure of "acted on"."""
        released: set[int] = set()
        for slot in slots:
            state = self._slots.pop(slot, None)
            if state is None:
                continue
            released.add(slot)
            if woken is not None and woken(state):
                self._hand_back_later(slot)
        return released

    def lose(self, state: S) -> bool:
        """Drop a slot a newer owner fenced this one out of, if `state` is still its ownership;
        True when it was. Then the slot's wake list gets a wake-up back, as for a released slot:
        the refused claim may have come from this wait's pop of the new owner's wake-up (a
        process frozen or cut off from ZooKeeper keeps its wait blocked on the slot's list and
        is served first), which the new owner would otherwise learn of from its watchdog, a
        second or more late. A wake-up too many costs the new owner one claim."""
        if self._slots.get(state.slot) is not state:
            return False
        del self._slots[state.slot]
        self._hand_back_later(state.slot)
        return True

    def _hand_back_later(self, slot: int) -> None:
        """`_hand_back` in a task of its own (kept in `_handing`): ownership never waits on
        Redis."""
        handing = asyncio.create_task(self._hand_back(slot))
        self._handing.add(handing)
        handing.add_done_callback(self._handing.discard)

    async def _hand_back(self, slot: int) -> None:
        """Push a wake-up onto the slot's list for whoever owns it now. Best effort: the new
        owner's watchdog remains the bound. Not for a slot moving or moved to another broker
        (its epoch the `moving:` tombstone): its owner waits there, and a list made here after
        the move's clean would be left behind on the source."""
        keys = slot_keys(self.queue.topic, slot)
        with contextlib.suppress(redis.RedisError):
            epoch = cast("bytes | None", await self.queue.redis.get(keys.key(Part.EPOCH)))
            if not (epoch or b"").startswith(FROZEN):
                await self.queue.redis.rpush(keys.key(Part.WAKE), "1")

    # the wake-up wait --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the blocking wait (once; `close` ends it)."""
        if self._waiting is None:
            self._waiting = asyncio.create_task(self._wait_for_wakes())

    async def close(self) -> None:
        """End the wait and free its connection and control key. Best effort against Redis."""
        self._closing = True
        await self.interrupt()
        if self._waiting is not None:
            try:
                await asyncio.wait_for(self._waiting, CLOSE_WAIT_S)
            except (TimeoutError, redis.RedisError):
                self._waiting.cancel()  # the interrupt did not get through
                with contextlib.suppress(asyncio.CancelledError, redis.RedisError):
                    await self._waiting
        if self._handing:  # wake-ups going back (`lose`, `release`) get their turn first
            await asyncio.wait(set(self._handing), timeout=CLOSE_WAIT_S)
        with contextlib.suppress(redis.RedisError):
            await self.queue.redis.delete(self._control_key)
        await self._waker.aclose(close_connection_pool=True)

    async def interrupt(self) -> None:
        """Unblock the wait so it picks up a changed set of slots (or ends). Best effort: if
        Redis refuses, the wait ends by itself within WAKE_BLOCK_S (a failing Redis ends it
        sooner), and ownership must never depend on Redis being up."""
        try:
            await self.queue.redis.rpush(self._control_key, "1")
        except redis.RedisError as error:
            log.info("could not interrupt the wake-up wait (%s)", error)

    async def _wait_for_wakes(self) -> None:
        reported_all_s = 0.0  # monotonic time every slot was last reported after a failed wait
        while not self._closing:
            command = self._wait_command()
            try:
                popped = await self._blpop(command.packed(self._first))
            except redis.RedisError as error:
                log.warning("wake-up wait failed (%s); retrying", error)
                if time.monotonic() - reported_all_s >= WAIT_FAILED_ALL_S:
                    reported_all_s = time.monotonic()
                    for owned in self:
                        self._wake(owned, 0)
                await asyncio.sleep(WAIT_RETRY_S)
                continue
            if popped is None or as_text(popped[0]) == self._control_key:
                continue
            key = as_text(popped[0])
            slot = parse_wake_key(key)
            self._first = command.after(slot)
            state = self._slots.get(slot)
            if state is not None:
                self._wake(state, due_of(popped[1]))
            else:
                # released while this wait was blocked on its key: the slot's new owner needs
                # the wake-up this wait took, so it goes back
                await self._hand_back(slot)

    def _wait_command(self) -> _WaitCommand:
        """The wait over the control list, then the wake list of every owned slot, made anew
        only when the owned slots changed: a herd over 1,024 slots wakes the wait once a slot,
        and making 1,024 key names every time was a fifth of the consumer's Python
        (docs/benchmarks.md, issue 30)."""
        slots = tuple(self._slots)
        if slots != self._command.slots:
            keys = [slot_keys(self.queue.topic, slot).key(Part.WAKE) for slot in slots]
            self._command = _WaitCommand(self._control_key, slots, keys)
            self._first = 0
        return self._command

    async def _blpop(self, command: bytes) -> list[bytes | str] | None:
        """One blocking pop, `command` as `_WaitCommand` packed it, on the wait's own connection
        (redis-py would pack its 1,025 keys again each time: ~0.9 ms of Python a wake-up at
        1,024 slots). A failed or cancelled wait drops the connection, so that a reply still to
        come is never read as the next wait's."""
        await self._waker.initialize()
        connection = self._waker.connection
        assert connection is not None  # a single-connection client has it once initialized
        try:
            await connection.send_packed_command(command)
            popped = await connection.read_response()
        except BaseException:
            await connection.disconnect()
            raise
        return cast("list[bytes | str] | None", popped)

    def _wake(self, state: S, due_ms: float) -> None:
        state.wakes += 1
        self._due_at(state, due_ms)


def _ever_woken(state: OwnedSlot) -> bool:
    """`release(hand_back=True)`'s measure: the slot's wait took any wake-up since it was
    owned (an owner that does not count its claims cannot tell which it acted on)."""
    return state.wakes > 0


def due_of(element: bytes | str) -> float:
    """The due time (the broker's ms) a wake-up holds. The marker `1` of a hand-back or of the
    previous version's scripts is a time long past: now. Anything but a whole number of at
    most 15 digits (any ms up to the year 33658) is 0, now too: a list the topic's own user
    wrote garbage to costs a claim, never a timer that does not fire."""
    text = as_text(element)
    return float(text) if len(text) <= 15 and text.isascii() and text.isdigit() else 0


class _WaitCommand:
    """The wait's BLPOP over the control list and the owned slots' wake lists, each key's bytes
    packed once. Its keys begin at a given slot and wrap around (`packed(first)`), so that
    the wait can begin after the slot it woke last: BLPOP pops the first non-empty list of
    its keys, and in a fixed order a slot's wake-up waited behind every lower slot's. At
    1,024 slots and 2,000 schedules a second, wake-ups came faster than the wait's pops on a
    loaded host, and the highest slots' waited until the watchdog found them, 1-2 s late."""

    __slots__ = ("_control", "_first_of", "_slot_keys", "_timeout", "slots")

    def __init__(self, control_key: str, slots: tuple[int, ...], keys: list[str]) -> None:
        self.slots = slots
        self._control = b"*%d\r\n$5\r\nBLPOP\r\n%s" % (len(keys) + 3, _bulk(control_key))
        self._slot_keys = [_bulk(key) for key in keys]
        self._first_of = {slot: at for at, slot in enumerate(slots)}
        self._timeout = _bulk(str(WAKE_BLOCK_S))

    def packed(self, first: int) -> bytes:
        """The command, the slots' keys from the `first`th on, then those before it."""
        keys = self._slot_keys
        return b"".join((self._control, *keys[first:], *keys[:first], self._timeout))

    def after(self, slot: int) -> int:
        """Where a wait that begins after `slot` begins (0 for a slot not in it)."""
        at = self._first_of.get(slot)
        return 0 if at is None else (at + 1) % len(self.slots)


def _bulk(text: str) -> bytes:
    """`text` as a RESP bulk string."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _blocking_client(client: redis.asyncio.Redis, block_s: float) -> redis.asyncio.Redis:
    """A one-connection client for the blocking wait, with a read timeout longer than the block.

    The shared pool's socket timeout (redis-py defaults to 5 s) would cut a longer BLPOP short,
    and a wait holding a pooled connection would take it from producers and claims.
    """
    pool = client.connection_pool
    options = {**pool.connection_kwargs, "socket_timeout": block_s + 5}
    return redis.asyncio.Redis(
        connection_pool=redis.asyncio.ConnectionPool(
            connection_class=pool.connection_class, max_connections=1, **options
        ),
        single_connection_client=True,
    )
