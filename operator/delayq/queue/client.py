"""The engine's Python API: `Queue` (blocking) and `AsyncQueue` (asyncio).

Both only execute the plans of `delayq.queue.plans`: one round trip per operation (a pipeline
when a batch touches several slots), each transition an FCALL of the engine's functions library
(`queue/functions.py`), loaded again when a broker lost it and the user may load it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, Unpack, cast

import redis
import redis.asyncio

from delayq.queue import (
    consume_plans,
    dead_plans,
    functions,
    plans,
    produce_plans,
    read_plans,
    schedule_plans,
    topic_record,
)
from delayq.queue.backoff import Backoff
from delayq.queue.codec import as_text
from delayq.queue.codes import (
    DelayqError,
    ReplicationTimeoutError,
    StaleEpochError,
    as_typed_error,
    raise_for_code,
)
from delayq.queue.consume_plans import received, received_all
from delayq.queue.keys import paused_key
from delayq.queue.model import (
    ClaimBatch,
    DeadBatchResult,
    DeadPage,
    Draw,
    Lease,
    Leased,
    MessageInfo,
    Mode,
    Outcome,
    Retry,
    ScheduleOptions,
    ScheduleRequest,
    ScheduleResult,
    SlotClaim,
    Target,
    TopicStats,
    schedule_request,
)
from delayq.queue.packing import use_hiredis_packing
from delayq.queue.plans import Plan, ScriptCall
from delayq.queue.renamed import renamed_kwargs
from delayq.queue.schedule_plans import Steps
from delayq.queue.schedules import DefineResult, Schedule, ScheduleInfo
from delayq.queue.scripts import Script
from delayq.queue.topic import Topic

T = TypeVar("T")
DEFAULT_CLAIM_BATCH = 500


def _not_loaded(replies: Sequence[Any]) -> list[int]:
    """Indexes of pipelined replies that failed with "Function not found" (the call did not
    run at all, so running it again after loading the library is safe)."""
    return [i for i, reply in enumerate(replies) if functions.is_missing(reply)]


def _send(target: Any, call: ScriptCall) -> Any:
    """FCALL (FCALL_RO for a read-only transition) of the call's function on `target`, a
    client (its reply, or an awaitable of it) or a pipeline (queued)."""
    library = functions.library()
    send = target.fcall_ro if library.command(call.script) == "FCALL_RO" else target.fcall
    return send(library.function(call.script), len(call.keys), *call.keys, *call.args)


def _typed_single(error: redis.ResponseError) -> Exception:
    return functions.missing_error(error) if functions.is_missing(error) else as_typed_error(error)


def _merged(replies: Sequence[Any], indexes: Sequence[int], again: Sequence[Any]) -> list[Any]:
    """The replies with those at `indexes` replaced by `again` (their calls, run again)."""
    result = list(replies)
    for index, reply in zip(indexes, again, strict=True):
        result[index] = reply
    return result


def _split_wait(replies: list[Any], wait: int) -> tuple[list[Any], int | None]:
    """The scripts' replies and, when the pipeline ended with WAIT, the replicas it counted.
    WAIT refused (a Redis user without the command) is raised: every acknowledged write would
    otherwise look unreplicated, silently."""
    if not wait:
        return replies, None
    *scripts, confirmed = replies
    if isinstance(confirmed, Exception):
        raise confirmed
    return scripts, int(confirmed)


def _typed(replies: list[Any]) -> list[Any]:
    """The replies with Redis's out-of-memory refusals as BrokerFullError."""
    return [as_typed_error(r) if isinstance(r, Exception) else r for r in replies]


def _raise_first_error(replies: list[Any]) -> list[Any]:
    """The replies, or the first error among them raised (as a plain pipeline would)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise as_typed_error(reply)
    return replies


def _replicas_to_wait(topic: Topic, plan: Plan[Any]) -> int:
    """Replicas the plan's answer waits for: the topic's `redis_sync_replicas` when the plan
    acknowledges a write, else none."""
    if topic.redis_sync_replicas and any(call.script.acknowledges_a_write for call in plan.calls):
        return topic.redis_sync_replicas
    return 0


def _combined(plan: Plan[T], replies: list[Any], confirmed: int | None, topic: Topic) -> T:
    """The plan's result, or ReplicationTimeoutError carrying it when fewer replicas than the
    topic asks for confirmed the writes in time (`confirmed` None: nothing was waited for)."""
    if confirmed is None or confirmed >= topic.redis_sync_replicas:
        return plan.combine(replies)
    result: object
    try:
        result = plan.combine(replies)
    except DelayqError as refusal:
        result = refusal
    wanted, timeout_ms = topic.redis_sync_replicas, topic.redis_sync_timeout_ms
    raise ReplicationTimeoutError(wanted, confirmed, timeout_ms, result)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class _Plans:
    """Plan builders behind each public method, shared by both flavours."""

    def __init__(self, topic: Topic) -> None:
        self.topic = topic

    def schedule(
        self, message_id: str, payload: bytes | str, options: ScheduleOptions
    ) -> Plan[ScheduleResult]:
        """The one result, or the refusal raised: a message refused (TooFarError,
        ExpiresBeforeDueError, OverQuotaError) is not stored, and a caller that only reads the
        return value must not lose it silently. EXISTS and ALREADY_DONE are answers, not
        refusals: they are returned."""
        request, mode = schedule_request(message_id, payload, options)
        plan = plans.first(produce_plans.schedule(self.topic, [request], mode))

        def combine(replies: list[Any]) -> ScheduleResult:
            result = plan.combine(replies)
            raise_for_code(result.code, "schedule", result.id)
            return result

        return Plan(plan.calls, combine)

    def reschedule(self, target: Target, delay_ms: int | None, at_ms: int | None) -> Plan[Outcome]:
        move = (target, delay_ms, at_ms)
        return plans.checked(produce_plans.reschedule(self.topic, [move]), Script.RESCHEDULE)

    def claim(
        self,
        slot: int,
        epoch: int,
        max_count: int,
        ack_timeout_ms: int | None,
        backoff: Backoff | None,
    ) -> Plan[ClaimBatch]:
        lease_ms = self.topic.lease_ms(ack_timeout_ms)
        return consume_plans.claim(self.topic, slot, epoch, max_count, lease_ms, backoff)

    def claim_slots(
        self, claims: Sequence[SlotClaim], ack_timeout_ms: int | None, backoff: Backoff | None
    ) -> Plan[list[ClaimBatch | StaleEpochError]]:
        return consume_plans.claim_slots(
            self.topic, claims, self.topic.lease_ms(ack_timeout_ms), backoff
        )


class Queue:
    """Blocking client of one topic."""

    def __init__(self, client: redis.Redis, topic: Topic) -> None:
        self.redis = client
        self.topic = topic
        self._plans = _Plans(topic)

    @classmethod
    def from_url(cls, url: str, topic: Topic, **options: Any) -> Queue:
        return cls(redis.Redis.from_url(url, **options), topic)

    def run(self, plan: Plan[T]) -> T:
        replies, confirmed = self._replies(plan)
        return _combined(plan, replies, confirmed, self.topic)

    def _replies(self, plan: Plan[T]) -> tuple[list[Any], int | None]:
        """One call as one FCALL; several in one pipeline. A call the broker has no function
        for ("Function not found": it did not run) loads the library (`functions.load`, which
        only a user with FUNCTION rights may; a restricted one gets FunctionsMissingError) and
        runs again.

        A write the topic replicates synchronously ends its pipeline with WAIT, on the same
        connection (WAIT covers that connection's writes): the replicas that confirmed them,
        the fewest over the pipelines a reload needed, come back with the replies."""
        wait = _replicas_to_wait(self.topic, plan)
        if len(plan.calls) == 1 and not wait:
            call = plan.calls[0]
            try:
                return [_send(self.redis, call)], None
            except redis.ResponseError as error:
                if not functions.is_missing(error):
                    if (typed := as_typed_error(error)) is error:
                        raise
                    raise typed from error
            functions.load(self.redis)
            try:
                return [_send(self.redis, call)], None
            except redis.ResponseError as error:
                if (typed := _typed_single(error)) is error:
                    raise
                raise typed from error
        replies, confirmed = self._pipelined(plan.calls, wait)
        if missing := _not_loaded(replies):
            functions.load(self.redis)
            again, confirmed_again = self._pipelined([plan.calls[i] for i in missing], wait)
            replies = _merged(replies, missing, again)
            confirmed = _least(confirmed, confirmed_again)
        return (_typed(replies) if plan.partial else _raise_first_error(replies)), confirmed

    def _pipelined(self, calls: Sequence[ScriptCall], wait: int) -> tuple[list[Any], int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            _send(pipe, call)
        if wait:
            pipe.wait(wait, self.topic.redis_sync_timeout_ms)
        replies = pipe.execute(raise_on_error=False)
        return _split_wait(replies, wait)

    def close(self) -> None:
        self.redis.close()

    # producing
    def schedule(
        self, message_id: str, payload: bytes | str = b"", **options: Unpack[ScheduleOptions]
    ) -> ScheduleResult:
        """Schedule one message (the options: ScheduleOptions). A refusal is raised (a
        ScriptRefusedError: OverQuotaError, ExpiresBeforeDueError, TooFarError; a bad id or
        payload InvalidMessageError), so a returned result is stored: CREATED, UPDATED, or the
        live message (EXISTS) or remembered outcome (ALREADY_DONE) create mode left alone."""
        return self.run(self._plans.schedule(message_id, payload, options))

    def schedule_many(
        self, requests: Sequence[ScheduleRequest], mode: Mode = Mode.CREATE
    ) -> list[ScheduleResult]:
        """A result per request, in order. When Redis refuses some slots' chunks after others
        were stored, raises `PartlyStoredError` whose `results` say which (resend only its
        `failures`); when nothing was stored, the Redis error itself."""
        return self.run(produce_plans.schedule(self.topic, requests, mode))

    def cancel(self, message_id: str, slot_basis: str | None = None) -> Outcome:
        return self.run(
            plans.first(produce_plans.cancel(self.topic, [Target(message_id, slot_basis)]))
        )

    def cancel_many(self, targets: Sequence[Target]) -> list[Outcome]:
        return self.run(produce_plans.cancel(self.topic, targets))

    def reschedule(
        self,
        message_id: str,
        *,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        slot_basis: str | None = None,
        slot: int | None = None,
    ) -> Outcome:
        """Move a scheduled message's due time; `slot` (the slot known to hold it, as a dead
        page lists) routes it instead of `slot_basis`."""
        target = Target(message_id, slot_basis, slot)
        return self.run(self._plans.reschedule(target, delay_ms, at_ms))

    def get(self, message_id: str, slot_basis: str | None = None) -> MessageInfo:
        """The message's state; one never scheduled, or forgotten, is `State.ABSENT` (an
        answer, as `get_many` gives per id; HTTP answers it 404), where `get_schedule` of a
        missing schedule raises NotFoundError (a schedule is an object, not a state)."""
        return self.run(plans.first(read_plans.get(self.topic, [Target(message_id, slot_basis)])))

    def get_many(self, targets: Sequence[Target]) -> list[MessageInfo]:
        return self.run(read_plans.get(self.topic, targets))

    # consuming
    def pause(self) -> None:
        """Pause the topic's delivery on this broker: its consumers stop claiming within a
        second (what is claimed finishes); scheduling goes on. Idempotent."""
        self.redis.set(paused_key(self.topic), "1")

    def resume(self) -> None:
        """Undo `pause`: consumers claim again within a second. Idempotent."""
        self.redis.delete(paused_key(self.topic))

    def is_paused(self) -> bool:
        # EXISTS, not GET: the flag's value is whatever a holder of the admin login set
        return bool(self.redis.exists(paused_key(self.topic)))

    def pause_as(self, holder: str) -> bool:
        """Pause unless paused already, marking the flag as `holder`'s (its value: `pause`
        writes "1"). True when the pause is holder's: set now, or left by an earlier run of the
        same holder that died before `resume_as` (a killed restore). False: someone else's pause,
        which `resume_as` leaves alone."""
        key = paused_key(self.topic)
        return bool(self.redis.set(key, holder, nx=True)) or self._pause_holder() == holder

    def resume_as(self, holder: str) -> bool:
        """Undo `pause_as` while the flag is still holder's: a `pause` over it since (the API,
        the operator's `spec.delivery.paused`) or a `resume` is left as it is. True when it
        resumed. The check and the delete are one script (resume-1): a pause set just before
        is never undone."""
        return self.run(consume_plans.resume_as(self.topic, holder))

    def _pause_holder(self) -> str | None:
        value = self.redis.get(paused_key(self.topic))
        return None if value is None else as_text(value)

    def publish_settings(self, owner: str, version: int) -> list[int]:
        """Publish the topic's settings record into every slot of this broker, as its owner
        (`topic_record.py`; a user that may only read it gets NoPermissionError); per slot,
        the version its record holds after the call (a newer one is kept). With recordBuckets
        or storeBuckets, the broker's libraries are listed first (admin rights,
        `topic_record.as_published`)."""
        libraries = functions.listed(self.redis) if topic_record.lists_libraries(self.topic) else {}
        topic = topic_record.as_published(self.topic, libraries)
        return self.run_steps(topic_record.publish(topic, owner, version))

    def take_over(self, slot: int) -> int:
        return self.run(consume_plans.fence(self.topic, slot))

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    def claim(
        self,
        slot: int,
        epoch: int,
        max_count: int = DEFAULT_CLAIM_BATCH,
        ack_timeout_ms: int | None = None,
        backoff: Backoff | None = None,
    ) -> ClaimBatch:
        """Claim due messages of `slot`; leases that ran out are retried after `backoff` (the
        topic's retry policy; None: at once)."""
        plan = self._plans.claim(slot, epoch, max_count, ack_timeout_ms, backoff)
        sent_s = time.monotonic()
        replies, _ = self._replies(plan)  # claims never wait for replicas
        received_s = time.monotonic()  # before decoding, which can take milliseconds
        return received(plan.combine(replies), sent_s, received_s)

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    def claim_slots(
        self,
        claims: Sequence[SlotClaim],
        ack_timeout_ms: int | None = None,
        backoff: Backoff | None = None,
    ) -> list[ClaimBatch | StaleEpochError]:
        """Claim from several slots in one round trip, each `SlotClaim` (slot, epoch, max_count)
        with its own count; a fenced-out slot yields its StaleEpochError in its place."""
        plan = self._plans.claim_slots(claims, ack_timeout_ms, backoff)
        sent_s = time.monotonic()
        replies, _ = self._replies(plan)  # claims never wait for replicas
        received_s = time.monotonic()  # before decoding, which can take milliseconds
        return received_all(plan.combine(replies), sent_s, received_s)

    def ack(self, lease: Lease) -> Outcome:
        return self.run(plans.checked(consume_plans.ack(self.topic, [lease]), Script.ACK))

    def ack_many(self, leases: Sequence[Leased]) -> list[Outcome]:
        return self.run(consume_plans.ack(self.topic, leases))

    def nack(
        self, lease: Lease, delay_ms: int = 0, reason: str = "", dead: bool = False
    ) -> Outcome:
        retry = Retry(lease, delay_ms, reason, dead)
        return self.run(plans.checked(consume_plans.nack(self.topic, [retry]), Script.NACK))

    def nack_many(self, retries: Sequence[Retry]) -> list[Outcome]:
        return self.run(consume_plans.nack(self.topic, retries))

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    def extend(self, lease: Lease, ack_timeout_ms: int) -> Outcome:
        return self.run(
            plans.checked(consume_plans.extend(self.topic, [lease], ack_timeout_ms), Script.EXTEND)
        )

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    def extend_many(self, leases: Sequence[Leased], ack_timeout_ms: int) -> list[Outcome]:
        return self.run(consume_plans.extend(self.topic, leases, ack_timeout_ms))

    def giveback_many(self, leases: Sequence[Leased]) -> list[Outcome]:
        """Give leased messages back undelivered (see `consume_plans.giveback`)."""
        return self.run(consume_plans.giveback(self.topic, leases))

    # dead letters
    def dead_page(self, slot: int, offset: int = 0, count: int = 100) -> DeadPage:
        return self.run(dead_plans.dead_page(self.topic, slot, offset, count))

    def redrive(self, slot: int, ids: Sequence[str]) -> list[Outcome]:
        return self.run(dead_plans.redrive(self.topic, slot, ids)).outcomes

    def redrive_all(self, slots: Iterable[int] | None = None) -> int:
        """Redrive every dead message, a bounded batch per call; returns how many moved."""
        return sum(self._drain(dead_plans.redrive, slot) for slot in self._slots(slots))

    def purge(self, slot: int, ids: Sequence[str]) -> list[Outcome]:
        return self.run(dead_plans.purge(self.topic, slot, ids)).outcomes

    def purge_all(self, slots: Iterable[int] | None = None) -> int:
        return sum(self._drain(dead_plans.purge, slot) for slot in self._slots(slots))

    def _drain(self, build: dead_plans.DeadBatchBuilder, slot: int) -> int:
        moved = 0
        while True:
            result: DeadBatchResult = self.run(build(self.topic, slot, None))
            moved += len(result.outcomes)
            if not result.outcomes or result.remaining_dead == 0:
                return moved

    def _slots(self, slots: Iterable[int] | None) -> Iterable[int]:
        return self.topic.slots if slots is None else slots

    # recurring schedules
    def run_steps(self, steps: Steps[T]) -> T:
        """Run a chain of plans (schedule_plans.Steps), each fed the previous one's result."""
        try:
            plan = next(steps)
            while True:
                plan = steps.send(self.run(plan))
        except StopIteration as done:
            return cast(T, done.value)

    def put_schedule(self, schedule: Schedule) -> DefineResult:
        """Create or replace a recurring schedule; its first occurrence is the first after the
        server's now (CREATED or UPDATED)."""
        return self.run_steps(schedule_plans.define(self.topic, schedule))

    def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Raises NotFoundError when there is no such schedule."""
        return self.run(schedule_plans.get(self.topic, schedule_id))

    def delete_schedule(self, schedule_id: str) -> Outcome:
        """Delete the schedule and remove its waiting occurrence (answered CANCELLED; the
        occurrence is not remembered as cancelled: `get` of it is ABSENT); an occurrence being
        delivered finishes. Raises NotFoundError when there is no such schedule."""
        return self.run(schedule_plans.drop(self.topic, schedule_id))

    def list_schedules(self, slots: Iterable[int] | None = None) -> list[ScheduleInfo]:
        return self.run(schedule_plans.read_slots(self.topic, self._slots(slots)))

    def top_up_schedules(self, slot: int) -> int:
        """Precompute the next occurrence of the slot's schedules that owe it (a claim reports
        them: `ClaimBatch.topups_owed`); the consumer calls this, any process may."""
        return self.run_steps(schedule_plans.top_up(self.topic, slot))

    # reading
    def stats(self, slots: Iterable[int] | None = None, groups: bool = False) -> TopicStats:
        """Depths and heads of `slots` (all when None); with `groups`, the fair groups' counts
        (`TopicStats.groups`) too."""
        return self.run(read_plans.stats(self.topic, slots, groups))


class AsyncQueue:
    """asyncio client of one topic; the same operations as `Queue`."""

    def __init__(self, client: redis.asyncio.Redis, topic: Topic) -> None:
        self.redis = client
        self.topic = topic
        self._plans = _Plans(topic)

    @classmethod
    def from_url(cls, url: str, topic: Topic, **options: Any) -> AsyncQueue:
        return cls(use_hiredis_packing(redis.asyncio.Redis.from_url(url, **options)), topic)

    async def run(self, plan: Plan[T]) -> T:
        replies, confirmed = await self._replies(plan)
        return _combined(plan, replies, confirmed, self.topic)

    async def _replies(self, plan: Plan[T]) -> tuple[list[Any], int | None]:
        """As Queue._replies."""
        wait = _replicas_to_wait(self.topic, plan)
        if len(plan.calls) == 1 and not wait:
            call = plan.calls[0]
            try:
                return [await _send(self.redis, call)], None
            except redis.ResponseError as error:
                if not functions.is_missing(error):
                    if (typed := as_typed_error(error)) is error:
                        raise
                    raise typed from error
            await functions.load_async(self.redis)
            try:
                return [await _send(self.redis, call)], None
            except redis.ResponseError as error:
                if (typed := _typed_single(error)) is error:
                    raise
                raise typed from error
        replies, confirmed = await self._pipelined(plan.calls, wait)
        if missing := _not_loaded(replies):
            await functions.load_async(self.redis)
            again, confirmed_again = await self._pipelined([plan.calls[i] for i in missing], wait)
            replies = _merged(replies, missing, again)
            confirmed = _least(confirmed, confirmed_again)
        return (_typed(replies) if plan.partial else _raise_first_error(replies)), confirmed

    async def _pipelined(
        self, calls: Sequence[ScriptCall], wait: int
    ) -> tuple[list[Any], int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            _send(pipe, call)
        if wait:
            pipe.wait(wait, self.topic.redis_sync_timeout_ms)
        return _split_wait(await pipe.execute(raise_on_error=False), wait)

    async def close(self) -> None:
        await self.redis.aclose()

    # producing
    async def schedule(
        self, message_id: str, payload: bytes | str = b"", **options: Unpack[ScheduleOptions]
    ) -> ScheduleResult:
        """As Queue.schedule."""
        return await self.run(self._plans.schedule(message_id, payload, options))

    async def schedule_many(
        self, requests: Sequence[ScheduleRequest], mode: Mode = Mode.CREATE
    ) -> list[ScheduleResult]:
        """As Queue.schedule_many."""
        return await self.run(produce_plans.schedule(self.topic, requests, mode))

    async def cancel(self, message_id: str, slot_basis: str | None = None) -> Outcome:
        return await self.run(
            plans.first(produce_plans.cancel(self.topic, [Target(message_id, slot_basis)]))
        )

    async def cancel_many(self, targets: Sequence[Target]) -> list[Outcome]:
        return await self.run(produce_plans.cancel(self.topic, targets))

    async def reschedule(
        self,
        message_id: str,
        *,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        slot_basis: str | None = None,
        slot: int | None = None,
    ) -> Outcome:
        """Move a scheduled message's due time; `slot` (the slot known to hold it, as a dead
        page lists) routes it instead of `slot_basis`."""
        target = Target(message_id, slot_basis, slot)
        return await self.run(self._plans.reschedule(target, delay_ms, at_ms))

    async def get(self, message_id: str, slot_basis: str | None = None) -> MessageInfo:
        """As Queue.get."""
        return await self.run(
            plans.first(read_plans.get(self.topic, [Target(message_id, slot_basis)]))
        )

    async def get_many(self, targets: Sequence[Target]) -> list[MessageInfo]:
        return await self.run(read_plans.get(self.topic, targets))

    # consuming
    async def pause(self) -> None:
        """As Queue.pause."""
        await self.redis.set(paused_key(self.topic), "1")

    async def resume(self) -> None:
        """As Queue.resume."""
        await self.redis.delete(paused_key(self.topic))

    async def is_paused(self) -> bool:
        return bool(await self.redis.exists(paused_key(self.topic)))  # as Queue.is_paused

    async def publish_settings(self, owner: str, version: int) -> list[int]:
        """As `Queue.publish_settings`."""
        listing = topic_record.lists_libraries(self.topic)
        libraries = await functions.listed_async(self.redis) if listing else {}
        topic = topic_record.as_published(self.topic, libraries)
        return await self.run_steps(topic_record.publish(topic, owner, version))

    async def take_over(self, slot: int) -> int:
        return await self.run(consume_plans.fence(self.topic, slot))

    async def take_over_slots(self, slots: Sequence[int]) -> list[int | Exception]:
        """`take_over` of each slot, in one round trip: its epoch, or its refusal in place."""
        return await self.run(consume_plans.fence_slots(self.topic, slots))

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    async def claim(
        self,
        slot: int,
        epoch: int,
        max_count: int = DEFAULT_CLAIM_BATCH,
        ack_timeout_ms: int | None = None,
        backoff: Backoff | None = None,
    ) -> ClaimBatch:
        """Claim due messages of `slot`; leases that ran out are retried after `backoff` (the
        topic's retry policy; None: at once)."""
        plan = self._plans.claim(slot, epoch, max_count, ack_timeout_ms, backoff)
        sent_s = time.monotonic()
        replies, _ = await self._replies(plan)  # claims never wait for replicas
        received_s = time.monotonic()  # before decoding, which can take milliseconds
        return received(plan.combine(replies), sent_s, received_s)

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    async def claim_slots(
        self,
        claims: Sequence[SlotClaim],
        ack_timeout_ms: int | None = None,
        backoff: Backoff | None = None,
    ) -> list[ClaimBatch | StaleEpochError]:
        """Claim from several slots in one round trip, each `SlotClaim` (slot, epoch, max_count)
        with its own count; a fenced-out slot yields its StaleEpochError in its place."""
        plan = self._plans.claim_slots(claims, ack_timeout_ms, backoff)
        sent_s = time.monotonic()
        replies, _ = await self._replies(plan)  # claims never wait for replicas
        received_s = time.monotonic()  # before decoding, which can take milliseconds
        return received_all(plan.combine(replies), sent_s, received_s)

    async def ack(self, lease: Lease) -> Outcome:
        return await self.run(plans.checked(consume_plans.ack(self.topic, [lease]), Script.ACK))

    async def ack_many(self, leases: Sequence[Leased]) -> list[Outcome]:
        return await self.run(consume_plans.ack(self.topic, leases))

    async def nack(
        self, lease: Lease, delay_ms: int = 0, reason: str = "", dead: bool = False
    ) -> Outcome:
        retry = Retry(lease, delay_ms, reason, dead)
        return await self.run(plans.checked(consume_plans.nack(self.topic, [retry]), Script.NACK))

    async def nack_many(self, retries: Sequence[Retry]) -> list[Outcome]:
        return await self.run(consume_plans.nack(self.topic, retries))

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    async def extend(self, lease: Lease, ack_timeout_ms: int) -> Outcome:
        return await self.run(
            plans.checked(consume_plans.extend(self.topic, [lease], ack_timeout_ms), Script.EXTEND)
        )

    @renamed_kwargs(lease_ms="ack_timeout_ms")
    async def extend_many(self, leases: Sequence[Leased], ack_timeout_ms: int) -> list[Outcome]:
        return await self.run(consume_plans.extend(self.topic, leases, ack_timeout_ms))

    async def pace(
        self, per_second: float, burst: int, want: int, least: int, returned: int = 0
    ) -> Draw:
        """Draw tokens from the topic's pace on this broker (`pacing.Pacer`): granted, and
        when none, the ms until some are there or the hold ends; at the limit of the topic's
        settings record, `per_second` and `burst` while it has none."""
        return await self.run(
            consume_plans.pace(self.topic, per_second, burst, want, least, returned)
        )

    async def hold(self, hold_ms: int, max_ms: int) -> int:
        """Hold the topic's delivery (every pod's `pace` grants nothing) for `hold_ms`, at most
        `max_ms`; returns the server ms it ends."""
        return await self.run(consume_plans.hold(self.topic, hold_ms, max_ms))

    async def giveback_many(self, leases: Sequence[Leased]) -> list[Outcome]:
        """Give leased messages back undelivered (see `consume_plans.giveback`)."""
        return await self.run(consume_plans.giveback(self.topic, leases))

    # dead letters
    async def dead_page(self, slot: int, offset: int = 0, count: int = 100) -> DeadPage:
        return await self.run(dead_plans.dead_page(self.topic, slot, offset, count))

    async def redrive(self, slot: int, ids: Sequence[str]) -> list[Outcome]:
        return (await self.run(dead_plans.redrive(self.topic, slot, ids))).outcomes

    async def redrive_all(self, slots: Iterable[int] | None = None) -> int:
        return sum([await self._drain(dead_plans.redrive, slot) for slot in self._slots(slots)])

    async def purge(self, slot: int, ids: Sequence[str]) -> list[Outcome]:
        return (await self.run(dead_plans.purge(self.topic, slot, ids))).outcomes

    async def purge_all(self, slots: Iterable[int] | None = None) -> int:
        return sum([await self._drain(dead_plans.purge, slot) for slot in self._slots(slots)])

    async def _drain(self, build: dead_plans.DeadBatchBuilder, slot: int) -> int:
        moved = 0
        while True:
            result: DeadBatchResult = await self.run(build(self.topic, slot, None))
            moved += len(result.outcomes)
            if not result.outcomes or result.remaining_dead == 0:
                return moved

    def _slots(self, slots: Iterable[int] | None) -> Iterable[int]:
        return self.topic.slots if slots is None else slots

    # recurring schedules
    async def run_steps(self, steps: Steps[T]) -> T:
        """As Queue.run_steps."""
        try:
            plan = next(steps)
            while True:
                plan = steps.send(await self.run(plan))
        except StopIteration as done:
            return cast(T, done.value)

    async def put_schedule(self, schedule: Schedule) -> DefineResult:
        """As Queue.put_schedule."""
        return await self.run_steps(schedule_plans.define(self.topic, schedule))

    async def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        return await self.run(schedule_plans.get(self.topic, schedule_id))

    async def delete_schedule(self, schedule_id: str) -> Outcome:
        """As Queue.delete_schedule."""
        return await self.run(schedule_plans.drop(self.topic, schedule_id))

    async def list_schedules(self, slots: Iterable[int] | None = None) -> list[ScheduleInfo]:
        return await self.run(schedule_plans.read_slots(self.topic, self._slots(slots)))

    async def top_up_schedules(self, slot: int) -> int:
        """As Queue.top_up_schedules."""
        return await self.run_steps(schedule_plans.top_up(self.topic, slot))

    # reading
    async def stats(self, slots: Iterable[int] | None = None, groups: bool = False) -> TopicStats:
        """As Queue.stats."""
        return await self.run(read_plans.stats(self.topic, slots, groups))
