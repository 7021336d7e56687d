"""The delay-queue engine: slot-sharded Redis store with two-phase (claim → ack) consumption.

The public API is what this module exports (`__all__`): the clients (`Queue`, `AsyncQueue`),
the topic (`Topic`), the consumer (`Consumer` and its settings), the requests the clients take,
the results they return and the errors they raise. Everything else under `delayq.queue`
(plans, scripts, keys, codec) is the engine's inside and may change without notice.
"""

from delayq.queue.backoff import Backoff
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.codec import Headers
from delayq.queue.codes import (
    Code,
    DelayqError,
    InvalidMessageError,
    LeaseLostError,
    NotFoundError,
    ScriptRefusedError,
    StaleEpochError,
    TooFarError,
    WrongStateError,
)
from delayq.queue.consumer import (
    Consumer,
    ConsumerCounters,
    ConsumerSettings,
    Handler,
    LeaseGoneError,
    NoSlotsError,
    PoisonMessageError,
)
from delayq.queue.model import (
    ClaimBatch,
    DeadBatchResult,
    DeadPage,
    Lease,
    Leased,
    Message,
    MessageInfo,
    Mode,
    Outcome,
    PartlyStoredError,
    Retry,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    SlotClaim,
    SlotStats,
    State,
    Target,
    TopicStats,
)
from delayq.queue.topic import Topic, TopicError, TopicType

__all__ = [
    "AsyncQueue",
    "Backoff",
    "ClaimBatch",
    "Code",
    "Consumer",
    "ConsumerCounters",
    "ConsumerSettings",
    "DeadBatchResult",
    "DeadPage",
    "DelayqError",
    "Handler",
    "Headers",
    "InvalidMessageError",
    "Lease",
    "LeaseGoneError",
    "LeaseLostError",
    "Leased",
    "Message",
    "MessageInfo",
    "Mode",
    "NoSlotsError",
    "NotFoundError",
    "Outcome",
    "PartlyStoredError",
    "PoisonMessageError",
    "Queue",
    "Retry",
    "ScheduleFailure",
    "ScheduleRequest",
    "ScheduleResult",
    "ScriptRefusedError",
    "SlotClaim",
    "SlotStats",
    "StaleEpochError",
    "State",
    "Target",
    "TooFarError",
    "Topic",
    "TopicError",
    "TopicStats",
    "TopicType",
    "WrongStateError",
]
