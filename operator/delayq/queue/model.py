"""The values the engine's API takes and returns (plain frozen dataclasses)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypedDict

from delayq.queue.codec import Headers, encode_id
from delayq.queue.codes import Code, DelayqError, InvalidMessageError
from delayq.queue.topic import Topic

SLOT_BASIS = "slot_basis"  # a slot basis follows the id rule: it is hashed and sent like one


class State(enum.StrEnum):
    """Where a message is: live (scheduled, prepared, dead), finished within the topic's
    outcome retention (done, cancelled, purged), or absent (never scheduled, or forgotten)."""

    SCHEDULED = "scheduled"
    PREPARED = "prepared"
    DEAD = "dead"
    DONE = "done"
    CANCELLED = "cancelled"
    PURGED = "purged"
    DROPPED = "dropped"  # retries exhausted on a topic whose retry.exhaustedAction is drop
    EXPIRED = "expired"  # past its expiry on a topic whose expiry.action is drop
    ABSENT = "absent"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({State.DONE, State.CANCELLED, State.PURGED, State.DROPPED, State.EXPIRED})


class Mode(enum.StrEnum):
    """How schedule treats an id that is already live."""

    # no-op that reports the existing message (Dyno-queues' ensure), or the outcome of one that
    # finished within the topic's outcome retention (ALREADY_DONE)
    CREATE = "create"
    UPSERT = "upsert"  # replace the message and move its due time


class ScheduleRequest(NamedTuple):
    """One message to schedule: exactly one of `delay_ms` (from server now) or `at_ms`; and at
    most one of `expire_at_ms` (an instant) or `ttl_ms` (after its due time), past which it is
    not delivered (without either, the topic's `expiry_ttl_ms` applies)."""

    id: str
    payload: bytes | str = b""
    delay_ms: int | None = None
    at_ms: int | None = None
    slot_basis: str | None = None
    headers: Headers | None = None
    expire_at_ms: int | None = None
    ttl_ms: int | None = None
    priority: int = 0  # 0..9: among messages already due, a higher one is claimed first
    group: str | None = None  # its fair group (a customer id): due groups are served in turn


class ScheduleOptions(TypedDict, total=False):
    """The keyword options of `schedule` (Queue, AsyncQueue, RoutedQueue: `**options:
    Unpack[ScheduleOptions]`), written once for the three: `mode` (default CREATE) and every
    field of `ScheduleRequest` but the id and the payload, meaning what it means there.
    Adding a scheduling option is a field there and its key here (a test holds the two
    equal)."""

    delay_ms: int | None
    at_ms: int | None
    slot_basis: str | None
    headers: Headers | None
    mode: Mode
    expire_at_ms: int | None
    ttl_ms: int | None
    priority: int
    group: str | None


def schedule_request(
    message_id: str, payload: bytes | str, options: ScheduleOptions
) -> tuple[ScheduleRequest, Mode]:
    """`schedule`'s arguments as the request and mode `schedule_many` takes."""
    mode = options.get("mode", Mode.CREATE)
    fields = {key: value for key, value in options.items() if key != "mode"}
    # the items of a TypedDict are `object` to mypy; their keys are ScheduleRequest's (tested)
    return ScheduleRequest(message_id, payload, **fields), mode  # type: ignore[arg-type]


class ScheduleResult(NamedTuple):
    id: str
    slot: int
    code: Code
    due_ms: int
    state: State


class ScheduleFailure(NamedTuple):
    """A batch item whose slot's call failed (`error`, as Redis answered it): not stored."""

    id: str
    slot: int
    error: Exception


class PartlyStoredError(DelayqError):
    """Some slots' calls of a batch failed after others had stored their messages.

    `results` has, in the batch's order, a ScheduleResult for each stored item and a
    ScheduleFailure for each other: resend exactly the failures (a resend of the whole batch
    would create again the stored messages that were delivered meanwhile).
    """

    def __init__(self, results: list[ScheduleResult | ScheduleFailure]) -> None:
        self.results = results
        failures = self.failures
        super().__init__(
            f"{len(results) - len(failures)} of {len(results)} messages stored, "
            f"{len(failures)} not: {failures[0].error}"
        )

    @property
    def failures(self) -> list[ScheduleFailure]:
        return [r for r in self.results if isinstance(r, ScheduleFailure)]


@dataclass(frozen=True)
class Target:
    """A message addressed by id, routed by its slot basis (the id itself unless given) or,
    instead of the basis, by `explicit_slot`, the slot known to hold it: a dead record does
    not keep its basis, so the slot a dead page lists is all a reader of that page has."""

    id: str
    slot_basis: str | None = None
    explicit_slot: int | None = None

    def slot(self, topic: Topic) -> int:
        """The slot of `topic` the message lives in (the routing every client uses); raises
        InvalidMessageError for a slot basis that breaks the id rule, an explicit slot outside
        the topic, or both given (they could disagree)."""
        if self.explicit_slot is not None:
            if self.slot_basis is not None:
                raise InvalidMessageError("give a slot basis or an explicit slot, not both")
            if not 0 <= self.explicit_slot < topic.slot_amount:
                raise InvalidMessageError(
                    f"slot {self.explicit_slot} is outside 0..{topic.slot_amount - 1}"
                )
            return self.explicit_slot
        if self.slot_basis is None:
            return topic.slot_of(self.id)
        return topic.slot_of(encode_id(self.slot_basis, SLOT_BASIS))


class Leased(Protocol):
    """Whatever carries a lease token: a `Lease`, or the `Message` it was claimed as (acking
    the message itself spares the consumer's hot path one tuple per delivery)."""

    @property
    def slot(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...


class Lease(NamedTuple):
    """The token of one delivery: acks, nacks, extends and give-backs must present it.

    `lease_id` is the number the claim drew from the slot's `leases` counter: it never repeats
    in a slot, so this token names exactly one lease (a stale token cannot touch a later lease
    of the same id, even after an upsert, a redrive or a new schedule reset its attempts);
    `epoch` is the slot owner's fencing epoch under which it was claimed.
    """

    slot: int
    id: str
    lease_id: int
    epoch: int


class Message(NamedTuple):
    """A claimed (leased) message.

    The per-message values (requests, results, leases, messages, outcomes) are NamedTuples
    rather than frozen dataclasses: they are built once per message on the hot paths, where a
    frozen dataclass costs several times more.
    """

    id: str
    slot: int
    payload: bytes
    headers: Headers
    attempt: int
    due_ms: int
    epoch: int
    lease_id: int
    # 0..9, read from the record the claim answers (its tagged `p` field): no read of its own
    priority: int = 0
    # its fair group (None: none), read from the record the claim answers as the priority is
    group: str | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.slot, self.id, self.lease_id, self.epoch)


@dataclass(frozen=True)
class Retry:
    """A nack: deliver again `delay_ms` after the server's now, or straight to `dead` (a message
    that can never succeed)."""

    lease: Lease
    delay_ms: int = 0
    reason: str = ""
    dead: bool = False


class SlotClaim(NamedTuple):
    """One slot's part of a multi-slot claim: claim up to `max_count` due messages of `slot`
    under the owner's fencing `epoch`."""

    slot: int
    epoch: int
    max_count: int


@dataclass(frozen=True)
class ClaimBatch:
    slot: int
    now_us: int  # the server clock at the claim, in µs: the consumer's clock estimate
    next_due_ms: int | None
    next_deadline_ms: int | None
    messages: list[Message]
    # recurring schedules of the slot owing a top-up (`Queue.top_up_schedules`) after the claim
    topups_owed: int = 0
    # time.monotonic() when the reply arrived, taken before decoding it (a large claim takes
    # milliseconds to decode): with now_us, the consumer's estimate of the server clock
    received_s: float = 0.0
    # time.monotonic() when the claim was sent: with now_us, how far ahead of a due time a
    # claim is best sent (ServerClock.arrival_ms); None when not known
    sent_s: float | None = None

    @property
    def now_ms(self) -> int:
        return self.now_us // 1000


@dataclass(frozen=True)
class MessageInfo:
    id: str
    slot: int
    state: State
    due_ms: int | None = None
    lease_deadline_ms: int | None = None
    died_ms: int | None = None
    attempts: int = 0
    payload: bytes = b""
    headers: Headers = field(default_factory=dict)
    dead_reason: str = ""
    finished_ms: int | None = None  # done, cancelled, purged, dropped or expired: when
    expire_at_ms: int | None = None  # not delivered after this instant
    priority: int = 0  # 0..9, the one it was scheduled with
    group: str | None = None  # the fair group it was scheduled with


class Outcome(NamedTuple):
    """Per-message result of ack, nack, extend, cancel, reschedule, redrive or purge."""

    id: str
    code: Code
    at_ms: int | None = None  # new due (reschedule, nack), lease deadline (extend), death (dead)


class Draw(NamedTuple):
    """A draw from the topic's pace (pace-1, `pacing.Pacer`)."""

    granted: int  # tokens granted (0: none now)
    wait_ms: int  # when none: until the hold ends or enough tokens are there
    per_second: float  # the rate limit obeyed: the topic's settings record's (0: none)
    burst: int  # the bucket's size (0: no rate limit)
    held: bool = False  # a receiver's hold lasts (wait_ms more)


class GroupCounts(NamedTuple):
    """The fair groups with a message waiting, by where they stand in the claims' round (as
    the claims left it: the one that finds a group's last message gone drops it): counts, not
    names, so a tenant's group never becomes a metric label."""

    due: int = 0  # its turn has come: a message due and room under maxInFlightPerGroup
    held: int = 0  # parked at maxInFlightPerGroup until a lease of it ends
    later: int = 0  # its next message is not due yet

    def plus(self, other: GroupCounts) -> GroupCounts:
        return GroupCounts(*(mine + theirs for mine, theirs in zip(self, other, strict=True)))


#: A slot without fair groups (most slots of most topics): one shared value.
NO_GROUPS = GroupCounts()


@dataclass(frozen=True)
class SlotStats:
    slot: int
    now_ms: int
    scheduled: int
    due: int
    prepared: int
    dead: int
    next_due_ms: int | None
    next_deadline_ms: int | None
    groups: GroupCounts = NO_GROUPS

    @property
    def oldest_overdue_ms(self) -> int:
        """How long the oldest due-but-unclaimed message has waited (0 when none)."""
        if self.due == 0 or self.next_due_ms is None:
            return 0
        return max(0, self.now_ms - self.next_due_ms)


@dataclass(frozen=True)
class TopicStats:
    slots: list[SlotStats]

    @property
    def scheduled(self) -> int:
        return sum(s.scheduled for s in self.slots)

    @property
    def due(self) -> int:
        return sum(s.due for s in self.slots)

    @property
    def prepared(self) -> int:
        return sum(s.prepared for s in self.slots)

    @property
    def dead(self) -> int:
        return sum(s.dead for s in self.slots)

    @property
    def next_due_ms(self) -> int | None:
        return min((s.next_due_ms for s in self.slots if s.next_due_ms is not None), default=None)

    @property
    def oldest_overdue_ms(self) -> int:
        return max((s.oldest_overdue_ms for s in self.slots), default=0)

    @property
    def groups(self) -> GroupCounts:
        """Summed over the slots: a group with messages in n slots counts n times (each slot
        keeps its own round)."""
        return GroupCounts(*map(sum, zip(*(s.groups for s in self.slots), strict=True)))


@dataclass(frozen=True)
class DeadBatchResult:
    """What one bounded redrive or purge call did, and how many dead messages the slot has left."""

    remaining_dead: int
    outcomes: list[Outcome]


@dataclass(frozen=True)
class DeadPage:
    total: int
    messages: list[MessageInfo]
