"""One delay-service process: takes the slots its Ownership grants and delivers their messages.

The service never picks slots itself. `Ownership.on_change` hands it the complete owned set;
the difference with the previous set goes to the delivery engine (`delivery/engines.py`, one
interface: one `Consumer` per broker for webhook and stream topics, each slot consumed on the
broker that stores it; the `PullLeaser` for pull), which fences each new slot on takeover.
Shutdown runs in the safe order: stop claiming, let in-flight deliveries finish (bounded), then
give the slots back, so the next owner does not redeliver what was just acknowledged.

An ownership pass never fails as a whole because of one slot: a granted slot whose take-over
fails (frozen by a slot move, its broker down) is skipped, recorded in `unconsumed` and retried
on its own timer (`unconsumed.py`), while every other slot is consumed at once. A slot frozen
longer than `move_stall_s` by a move whose mover stopped is finished (or rolled back) by this
process, and one frozen by a doubling whose splitter stopped gets the doubling completed
(`stopped_moves.py`).

Readiness tells the truth about delivery: a background probe (once a second) checks that the
slots the delivery engine really consumes are the ones the ownership grants and that their
brokers answer; `/readyz` answers the cached verdict with hysteresis (`readiness.py`). The same
probe takes back a granted slot the engine dropped (fenced out by an epoch that a Redis failover
rolled back, or an own that failed while Redis was down), once ZooKeeper confirms the slot is
still this process's.

A doubling of the slot amount (docs/coordination.md "Doubling the slots") moves the topic to
new slots on new keys; the service does not rebuild itself in place: on a routing of a newer
key generation it sets `resharded`, and `serve` stops it (the safe order above) and starts a
new one on the routing's slot amount and generation, in the same process. Before that, while
the doubling's freeze switches the old slots one at a time (`Routing.doubled_slots`), the
owner of a switched old slot s consumes its halves s and s + N at the next generation at once,
through a second engine (`halves`: consumers of its own, so every per-message lookup, lease
and ack is that generation's; the same sink, so the delivery bounds hold for both; on a pull
topic the same leaser, whose lease tokens name the generation): ownership stays by old slot
number until the doubling ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from delayq.coordination.ownership import EmbeddedOwnership, Ownership, SessionHolder
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import RoutingWatch
from delayq.queue.client import AsyncQueue
from delayq.queue.codes import SLOT_MOVING, SlotMovingError
from delayq.queue.consumer import ConsumerCounters, ConsumerSettings
from delayq.queue.pacing import MAX_HOLD_MS, Pacer
from delayq.queue.topic import TopicType
from delayq.service.brokers import Brokers, connect, default_routing
from delayq.service.config import ServiceConfig
from delayq.service.delivery.engines import Delivery, PullDelivery, PushDelivery
from delayq.service.delivery.pull import PullLeaser
from delayq.service.delivery.sinks import Sink
from delayq.service.delivery.stream import StreamSink
from delayq.service.delivery.webhook import WebhookSink
from delayq.service.metrics import ServiceMetrics
from delayq.service.readiness import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, Readiness
from delayq.service.shutdown import OWNERSHIP_STOP_TIMEOUT_S, release_drain_s
from delayq.service.stopped_moves import end_stopped_moves
from delayq.service.tracing import Tracing
from delayq.service.unconsumed import RETRY_MAX_S, UnconsumedSlots, Why

log = logging.getLogger(__name__)


class DelayService:
    def __init__(
        self,
        config: ServiceConfig,
        ownership: Ownership | None = None,
        slot_generation: int = 0,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.tracing = tracing  # None: off (the default), nothing of OpenTelemetry loaded
        self.topic = dataclasses.replace(config.to_topic(), slot_generation=slot_generation)
        self.metrics = ServiceMetrics(self.topic.namespace, self.topic.name)
        self.queues = [
            AsyncQueue(connect(url, config.redis_max_connections), self.topic)
            for url in config.broker_redis_urls
        ]
        self.brokers = Brokers(
            self.queues, default_routing(self.topic.slot_amount, len(self.queues))
        )
        self.ownership = ownership or EmbeddedOwnership(self.topic.slot_amount)
        self.pacer = self._pacer()
        self.delivery = self._delivery()  # started by start()
        self.lease_tokens = config.lease_tokens()  # pull topics' tokens, bound to this topic
        self._closing = False
        self._lock = asyncio.Lock()
        self.broken = asyncio.Event()  # a delivery loop died: the process must restart
        self.readiness = Readiness()
        self._prober: asyncio.Task[None] | None = None
        # granted slots whose take-over failed, each retried on its own timer
        self.unconsumed = UnconsumedSlots()
        self._unconsumed_changed = asyncio.Event()
        self._retrier: asyncio.Task[None] | None = None
        self._ending_moves: asyncio.Task[None] | None = None  # ending stopped moves now
        self._moves_ended_at_s = -RETRY_MAX_S  # monotonic time it last started (one ZK session)
        # a slot frozen this long by a move (or a doubling) is ended here: its mover's lock,
        # should it have been killed, went with its session one session timeout after its death
        self.move_stall_s = 2 * config.zookeeper_session_timeout_ms / 1000
        self._routing_watch: RoutingWatch | None = None
        # set (and replaced) on every routing change: a write refused as SLOT_MOVING waits on it
        self.routing_changed = asyncio.Event()
        # set when the routing has a newer key generation (the slots doubled): this service
        # serves stale slots, `serve` replaces it by one on `doubled`
        self.resharded = asyncio.Event()
        self.doubled: Routing | None = None
        # the halves of the owned old slots the doubling switched, consumed at generation + 1
        # (`_sync_halves`); made at the first switch this service sees
        self.halves: Delivery | None = None
        self._halves_lost: set[int] = set()  # fenced out by a newer owner: never taken back
        self.unconsumed_halves = UnconsumedSlots()  # halves whose take-over failed, by half
        self.metrics.watch_counters(self.counters)
        self.metrics.watch_pacer(self.pacer)
        if (leaser := self.leaser) is not None:
            self.metrics.watch_unreachable(lambda: leaser.unreachable)
        if isinstance(self.ownership, SessionHolder):
            self.metrics.watch_session(self.ownership)

    @property
    def owned_slots(self) -> list[int]:
        return self.delivery.owned_slots

    @property
    def leaser(self) -> PullLeaser | None:
        """The pull topic's leaser (its HTTP routes lease through it); None for push topics."""
        return self.delivery.leaser if isinstance(self.delivery, PullDelivery) else None

    @property
    def closing(self) -> bool:
        return self._closing

    def counters(self) -> ConsumerCounters:
        """The delivery engines' counters (for metrics)."""
        total = self.delivery.counters()
        if self.halves is not None:
            for name, value in vars(self.halves.counters()).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def _pacer(self) -> Pacer:
        """The topic's pace on its first broker, on every topic: its rate limit may be set
        while the pods run (the settings record's, which every draw reads), and a webhook's
        receiver may ask for time. Without a limit it asks Redis a few times a second only."""
        return Pacer(
            self.queues[0], self.config.rate_limit_per_second, self.config.rate_limit_burst
        )

    def _delivery(self) -> Delivery:
        """The topic type's delivery engine: the one place that tells the types apart."""
        if self.topic.topic_type is TopicType.PULL:
            return PullDelivery(self.brokers, self.pacer, self.config.backoff)
        return self._push_delivery(self.brokers, self._on_slot_lost)

    def _push_delivery(
        self,
        brokers: Brokers,
        on_slot_lost: Callable[[int], None],
        beside: PushDelivery | None = None,
    ) -> PushDelivery:
        """A push engine on `brokers`: this service's slots, or a doubling's halves `beside`
        them (sharing their sink)."""
        settings = ConsumerSettings(
            batch_size=self.config.batch_size,
            worker_concurrency=self.config.worker_concurrency,
            ack_timeout_ms=self.config.ack_timeout_ms,
            # as many handlers per batch as messages the sink's POSTs may carry at once
            batch_concurrency=self.config.webhook_max_in_flight * self.config.webhook_max_batch,
            backoff=self.config.backoff,
            release_drain_s=release_drain_s(self.topic.topic_type, self.config.webhook_timeout_ms),
        )
        return PushDelivery(
            brokers,
            settings,
            self.metrics,
            on_slot_lost,
            self._sink,
            self.pacer,
            beside,
            self.tracing,
        )

    async def start(self) -> None:
        await self._load_routing()
        if self.resharded.is_set():
            return  # nothing started: `serve` starts the service of the new slots instead
        for queue in self.queues:  # a broker down at start: `serve` exits 1 or waits
            await queue.redis.ping()  # (once running, a slot it fails on is retried alone)
        if await self.brokers.publish_settings(time.time_ns() // 1_000_000):
            log.info("published the topic's settings", extra={"topic": self.topic.name})
        self.delivery.start(self._on_run_done)
        self._retrier = asyncio.create_task(self._retry_unconsumed_forever())
        self._retrier.add_done_callback(self._on_run_done)  # it ends only on stop()
        await self.ownership.start(self._on_change)
        self.readiness.observe(await self._probe(), time.monotonic())  # ready as soon as it is
        self._prober = asyncio.create_task(self._probe_forever())
        log.info(
            "service started",
            extra={
                "topic": self.topic.name,
                "type": self.topic.topic_type,
                "brokers": len(self.queues),
            },
        )

    async def _load_routing(self) -> None:
        """Topics with ZooKeeper take the routing node, and follow it: a slot move switches
        a slot's broker while the process runs, a doubling its slot amount (one broker too)."""
        if not self.config.zookeeper_connect:
            return
        self._routing_watch = RoutingWatch(
            self.config.zookeeper_connect,
            self.topic.namespace,
            self.topic.name,
            self.topic.slot_amount,
            self.config.zookeeper_identity,
            self.config.zookeeper_client_tls,
            generation=self.topic.slot_generation,
        )
        routing = await self._routing_watch.start(self._on_routing)
        if routing is None:
            return
        if routing.generation > self.topic.slot_generation:
            self._reshard(routing)
        elif max(routing.broker_of_slot) < len(self.queues):
            self.brokers.routing[:] = routing.broker_of_slot
            self.brokers.doubled_slots = routing.doubled_slots

    def _on_routing(self, routing: Routing) -> None:
        if routing.generation > self.topic.slot_generation:
            self._reshard(routing)
        else:
            self._double(routing.doubled_slots)
            asyncio.get_running_loop().create_task(self._reroute(list(routing.broker_of_slot)))

    def _double(self, slots: frozenset[int]) -> None:
        """A doubling switched old slots to their halves (`Routing.doubled_slots`): the API
        writes and reads their messages there from now on (`Brokers.place`), and the requests
        waiting on a SLOT_MOVING refusal are sent again. The consumers stay on the old slots
        until the doubling's last switch (`_reshard`)."""
        if slots != self.brokers.doubled_slots:
            self.brokers.doubled_slots = slots
            changed, self.routing_changed = self.routing_changed, asyncio.Event()
            changed.set()
            asyncio.get_running_loop().create_task(self._resync_halves())

    async def _resync_halves(self) -> None:
        async with self._lock:
            await self._sync_halves()

    async def _sync_halves(self) -> None:
        """Consume the halves (s and s + N at generation + 1) of every owned old slot s the
        doubling switched, and only those (called under the lock after every change of the
        owned set or of `doubled_slots`). A half that cannot be taken now is tried again by
        the probe; one a newer owner fenced this process out of (the service of the doubled
        slots, once the doubling ended) is left to it."""
        amount = self.topic.slot_amount
        switched = set() if self._closing else self.ownership.owned & self.brokers.doubled_slots
        halves = {half for slot in switched for half in (slot, slot + amount)}
        self._halves_lost &= halves
        wanted = frozenset(halves - self._halves_lost)
        if self.halves is None:
            if not wanted:
                return
            self.halves = self._halves_delivery()
            self.halves.start(self._on_run_done)
        consumed = frozenset(self.halves.owned_slots)
        if consumed - wanted:
            await self.halves.release(consumed - wanted)
        failed: dict[int, Exception] = {}
        if wanted - consumed:
            failed = dict(await self.halves.own(wanted - consumed))
            if failed.keys() - self.unconsumed_halves.slots.keys():
                log.warning(
                    "switched halves not taken over; retrying them",
                    extra={"slots": sorted(failed), "error": str(next(iter(failed.values())))},
                )
            elif not failed:
                log.info("consuming the halves of switched slots", extra={"halves": sorted(wanted)})
        known = frozenset(self.unconsumed_halves.slots)
        if known or failed:
            self.unconsumed_halves.forget(known - failed.keys())
            self.unconsumed_halves.failed(failed, time.monotonic())
            self._unconsumed_updated()

    def _halves_delivery(self) -> Delivery:
        """The engine of the halves, beside the slots' own: sharing its sink (push), or its
        leaser (pull: one rotation, rate limit and long poll for both)."""
        if isinstance(self.delivery, PullDelivery):
            return PullDelivery(
                self.brokers.halves(), beside=self.delivery, on_slot_lost=self._on_half_lost
            )
        assert isinstance(self.delivery, PushDelivery)  # the two kinds of engine
        return self._push_delivery(self.brokers.halves(), self._on_half_lost, beside=self.delivery)

    def lease_brokers(self, generation: int, slot: int) -> Brokers | None:
        """Where a pull lease of `slot` at key `generation` (its token's) is acked, nacked or
        extended: this service's brokers, or a doubling's halves (the next generation). None
        where it can be no more: an older generation's keys, and an old slot the doubling
        switched, are frozen tombstones whose owner the freeze fenced out (its message was
        copied into its half, whose owner rolled that lease back), so the lease is answered
        as fenced (`STALE_EPOCH`) without a call that would wait on SLOT_MOVING. A newer
        generation than the halves' is a newer service's: this one is stale (SLOT_MOVING)."""
        own = self.topic.slot_generation
        if generation == own + 1:
            return self.brokers.halves()
        if generation > own:
            raise SlotMovingError(
                f"{SLOT_MOVING}: a lease of key generation {generation}; this process serves "
                f"generation {own} (its service is being replaced): send it again"
            )
        if generation < own or slot in self.brokers.doubled_slots:
            return None
        return self.brokers

    def _on_half_lost(self, half: int) -> None:
        """Fenced out of a half: by the service of the doubled slots (the doubling ended), or
        by the next owner of its old slot. Either way it is theirs now."""
        log.info("fenced out of a switched half", extra={"slot": half})
        self._halves_lost.add(half)

    def _reshard(self, routing: Routing) -> None:
        """The slots doubled: hand over to `serve`, and wake the requests waiting for a
        routing change (they answer SLOT_MOVING now, to be sent again to the new service)."""
        log.info(
            "the slots doubled: restarting on the new slots",
            extra={"slots": routing.slot_amount, "generation": routing.generation},
        )
        self.doubled = routing
        self.resharded.set()
        changed, self.routing_changed = self.routing_changed, asyncio.Event()
        changed.set()

    async def _reroute(self, routing: list[int]) -> None:
        """Follow a routing change: each owned slot whose broker changed (a move switched it)
        is released on the old broker's engine and taken over on the new one's, whose fence
        raises the epoch above the old one; then writes refused meanwhile are retried."""
        if max(routing) >= len(self.queues):
            log.error("routing names a broker this process has no URL for; ignored")
            return
        async with self._lock:
            moved = frozenset(s for s, b in enumerate(routing) if self.brokers.routing[s] != b)
            if not moved:
                return
            engaged = moved & frozenset(self.owned_slots)
            if engaged:
                await self._apply(engaged, release=True)  # split by the old routing
            self.brokers.routing[:] = routing
            granted = moved & self.ownership.owned
            if granted and not self._closing:
                await self._apply(granted, release=False)  # failures: retried on their timer
            log.info("routing changed", extra={"moved": sorted(moved)})
        changed, self.routing_changed = self.routing_changed, asyncio.Event()
        changed.set()

    def _sink(self, delivery: PushDelivery) -> Sink:
        """The push topic's sink, on `delivery`'s server clocks and lease checks."""
        config = self.config
        if self.topic.topic_type is TopicType.WEBHOOK:
            return WebhookSink(
                self.topic,
                config.webhook_url,
                config.webhook_signer,
                config.webhook_timeout_ms,
                config.webhook_max_in_flight,
                self.metrics,
                config.member,
                delivery.server_ms,
                delivery.lease_deadline_ms,
                targets=config.webhook_targets,
                extra_headers=config.webhook_headers,
                max_batch=config.webhook_max_batch,
                hold=self.pacer.hold,
                held=self.pacer.held,
                max_hold_ms=self.topic.expiry_ttl_ms or MAX_HOLD_MS,
                max_held_ms=config.webhook_max_held_ms,
                trace_headers=self.tracing.inject if self.tracing is not None else None,
            )
        if config.stream_url:
            client = connect(
                config.stream_url, config.redis_max_connections, config.stream_targets
            )
            return StreamSink(self.topic, client, config.target_stream, config.stream_max_len, True)
        return StreamSink(
            self.topic, self.queues[0].redis, config.target_stream, config.stream_max_len, False
        )

    async def _on_change(self, slots: frozenset[int]) -> None:
        """Apply the owned set: release first (stop claiming), then take over the new ones."""
        async with self._lock:
            wanted = frozenset() if self._closing else slots
            owned = frozenset(self.owned_slots)
            self._forget_unconsumed(frozenset(self.unconsumed.slots) - wanted)
            if owned - wanted:
                await self._apply(owned - wanted, release=True)
            if wanted - owned:
                await self._apply(wanted - owned, release=False)
            await self._sync_halves()
            log.info("owned slots changed", extra={"owned": sorted(wanted)})

    async def _apply(self, slots: frozenset[int], release: bool) -> None:
        """Release or take over `slots`; a slot that cannot be taken over now is recorded in
        `unconsumed` (retried on its timer, reported), never an error of the whole pass."""
        if release:
            self._forget_unconsumed(slots)
            await self.delivery.release(slots)
            return
        failed: dict[int, Exception] = dict(await self.delivery.own(slots))
        self._forget_unconsumed(slots - failed.keys())
        if failed:
            fresh = sorted(failed.keys() - self.unconsumed.slots.keys())
            self.unconsumed.failed(failed, time.monotonic())
            if fresh:
                log.warning(
                    "granted slots not taken over; retrying them on their own",
                    extra={"slots": fresh, "error": str(failed[fresh[0]])},
                )
        self._unconsumed_updated()

    def _forget_unconsumed(self, slots: frozenset[int]) -> None:
        """The slots are consumed, or no longer granted: nothing to retry for them."""
        if slots & self.unconsumed.slots.keys():
            self.unconsumed.forget(slots)
            self._unconsumed_updated()

    def _unconsumed_updated(self) -> None:
        both = (self.unconsumed, self.unconsumed_halves)
        self.metrics.set_unconsumed(
            sum(u.count(Why.MOVING) for u in both), sum(u.count(Why.ERROR) for u in both)
        )
        self._unconsumed_changed.set()

    def unconsumed_report(self) -> dict[str, str]:
        """The granted slots not consumed, and why (`/readyz`): old slots by number, a
        doubling's halves as `g<generation>/<slot>`."""
        halves = self.unconsumed_halves.report(f"g{self.topic.slot_generation + 1}/")
        return {**self.unconsumed.report(), **halves}

    async def _retry_unconsumed_forever(self) -> None:
        """Take over each unconsumed granted slot again when its backoff ends, and end a move
        or doubling that left a slot frozen past `move_stall_s` (stopped_moves.py)."""
        while not self._closing:
            next_s = self.unconsumed.next_retry_s()
            self._unconsumed_changed.clear()
            with contextlib.suppress(TimeoutError):
                timeout = None if next_s is None else max(0.0, next_s - time.monotonic())
                await asyncio.wait_for(self._unconsumed_changed.wait(), timeout)
            async with self._lock:
                if self._closing:
                    return
                granted = self.ownership.owned
                self._forget_unconsumed(frozenset(self.unconsumed.slots) - granted)
                due = self.unconsumed.due(time.monotonic()) - frozenset(self.owned_slots)
                if due:
                    await self._apply(due, release=False)
            stalled = self.unconsumed.moving_since(time.monotonic() - self.move_stall_s)
            ending = self._ending_moves is not None and not self._ending_moves.done()
            recently = time.monotonic() - self._moves_ended_at_s < RETRY_MAX_S
            if stalled and self.config.zookeeper_connect and not ending and not recently:
                self._moves_ended_at_s = time.monotonic()
                self._ending_moves = asyncio.create_task(self._end_stopped_moves(stalled))

    async def _end_stopped_moves(self, slots: frozenset[int]) -> None:
        """Finish or roll back the moves that froze `slots`, complete the doubling that froze
        the others (in a thread: the movers are sync); what fails (a mover holds the lock, a
        broker or ZooKeeper down) is tried again on a later retry. The slots are taken over by
        their retry timer or the routing change (a doubling's: `resharded`)."""
        try:
            done = await asyncio.to_thread(end_stopped_moves, self.config, slots)
            if done:
                log.warning("ended moves that had stopped", extra={"slots": done})
        except Exception as error:  # kazoo, Redis: all mean "not now"
            log.info("could not end stopped moves yet", extra={"error": str(error)})

    def _on_run_done(self, task: asyncio.Task[None]) -> None:
        """A Consumer's loop (or the retry of unconsumed slots) ends only on stop(); anything
        else (a Redis outage it does not survive) makes the service unready and `serve` exit
        non-zero, so it gets restarted."""
        if self._closing or task.cancelled():
            return
        log.error("delivery loop ended unexpectedly", exc_info=task.exception())
        self.broken.set()

    def _on_slot_lost(self, slot: int) -> None:
        """Fenced out: a newer owner, or an epoch rolled back by a Redis failover. The probe
        takes the slot back if ZooKeeper still says it is ours (run it now, not in a second)."""
        log.warning("fenced out of a slot", extra={"slot": slot})
        if not self._closing:
            asyncio.get_running_loop().create_task(self._take_back_missing())

    async def _take_back_missing(self) -> None:
        """Own again every slot the ownership grants but the engine does not consume, after
        asking the coordination itself (a stale view must not steal a slot back)."""
        async with self._lock:
            if self._closing:
                return
            # slots whose take-over failed are retried on their own timer
            missing = (
                self.ownership.owned - frozenset(self.owned_slots) - self.unconsumed.slots.keys()
            )
            confirmed = frozenset(
                [slot for slot in sorted(missing) if await self.ownership.holds(slot)]
            )
            if confirmed:
                log.warning("taking back granted slots", extra={"slots": sorted(confirmed)})
                await self._apply(confirmed, release=False)  # failures: retried on their timer

    async def _probe_forever(self) -> None:
        """A verdict every PROBE_INTERVAL_S whatever happens: a probe that hangs (Redis or
        ZooKeeper not answering) is a failure, never a stale "ready"."""
        while not self._closing:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                failure = await asyncio.wait_for(self._probe(), PROBE_TIMEOUT_S)
            except TimeoutError:
                failure = "probe timed out (a broker or ZooKeeper does not answer)"
            self.readiness.observe(failure, time.monotonic())

    async def _probe(self) -> str | None:
        """What keeps this process from delivering what it was granted (None: nothing)."""
        if not self.ownership.ready:
            return "ownership not settled (ZooKeeper unreachable or assignment changing)"
        if self.halves is not None and not self._lock.locked():
            await self._resync_halves()  # halves whose take-over failed: tried again
        # a slot frozen by a move or a doubling is reported (/readyz, metric), not a reason to
        # be unready: no process could consume it, and either is ended here past `move_stall_s`
        moving = frozenset(s for s, u in self.unconsumed.slots.items() if u.why is Why.MOVING)
        if frozenset(self.owned_slots) | moving != self.ownership.owned | moving:
            # an ownership change still being applied holds the lock: that is the mismatch
            # this probe reports, not something to wait for
            if not self._lock.locked():
                await self._take_back_missing()
            if frozenset(self.owned_slots) | moving != self.ownership.owned | moving:
                failing = self.unconsumed.count(Why.ERROR)
                return "granted slots not consumed" + (
                    f" ({failing} failing to be taken over: see unconsumedSlots)" if failing else ""
                )
        failing = self.unconsumed_halves.count(Why.ERROR)
        if failing:
            return f"switched halves not consumed ({failing} failing: see unconsumedSlots)"
        return await self.brokers.unavailable(self.owned_slots)

    async def is_ready(self) -> bool:
        """The probe's cached verdict (never waits on Redis); false at once while stopping,
        after a delivery loop died or once the slots doubled (until the new service runs)."""
        if self._closing or self.broken.is_set() or self.resharded.is_set():
            self.readiness.fail_now(
                "stopping"
                if self._closing
                else "delivery loop died"
                if self.broken.is_set()
                else "the slots doubled"
            )
        return self.readiness.ready

    async def refresh_depth(self) -> None:
        stats = await self.brokers.stats(self.owned_slots, groups=True)
        self.metrics.set_depth(stats, await self.read_paused())

    @property
    def paused(self) -> bool:
        """The topic's delivery is paused (as this process last read it, at most a second ago)."""
        return self.delivery.paused

    async def read_paused(self) -> bool:
        """`paused`, read from the brokers now where this process would otherwise read it only
        on a lease request (an idle pull process would report a stale flag); consumers read it
        every second on their own."""
        return await self.delivery.read_paused()

    async def pause(self, paused: bool) -> None:
        """Pause (or resume) the topic's delivery on every broker, and make this process's own
        consumers see it at once; the topic's other processes see it within a second.
        Scheduling goes on; what is claimed already is delivered (or its lease runs out)."""
        for queue in self.queues:
            await (queue.pause() if paused else queue.resume())
        await self.delivery.refresh_paused()
        if self.halves is not None:  # the same flag: the halves' consumers read it too
            await self.halves.refresh_paused()

    async def stop(self) -> None:
        """Stop claiming, finish in-flight deliveries within the grace period, release slots."""
        self._closing = True
        started = time.monotonic()
        if self._prober is not None:
            self._prober.cancel()
        if self._retrier is not None:
            self._retrier.cancel()
        await self._on_change(frozenset())
        engines = [self.delivery] + ([self.halves] if self.halves is not None else [])
        for engine in engines:
            engine.stop()
        for engine in engines:
            await engine.drain(self.config.grace_ms / 1000)
        try:
            await asyncio.wait_for(self.ownership.stop(), OWNERSHIP_STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("ownership did not stop in time; its session expiry will free the slots")
        for engine in engines:
            await engine.close()
        if self._routing_watch is not None:
            await self._routing_watch.stop()
        await self.brokers.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)  # blocks on the export: not the loop
        log.info("service stopped", extra={"took_ms": int((time.monotonic() - started) * 1000)})
