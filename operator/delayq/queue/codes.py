"""Return codes of the Lua transitions and the exceptions they map to.

The numbers are the contract with `lua/*.lua`: the scripts return them by name (`CODE.ACKED`)
from a table `scripts.lua_code_table` generates from this enum at load time, so add or renumber
a code here only. Each script's header lists the codes it returns; `tests/queue/test_scripts.py`
checks those against this enum and against the `CODE.*` names the script uses.
"""

from __future__ import annotations

import enum
import re

import redis


class Code(enum.IntEnum):
    """Per-message outcome of a script: positive is a transition, negative a refusal."""

    OK = 0
    CREATED = 1
    EXISTS = 2
    UPDATED = 3
    CANCELLED = 4
    RESCHEDULED = 5
    ALREADY_DONE = 6
    ACKED = 7
    RETRY_SCHEDULED = 8
    DEAD = 9
    EXTENDED = 10
    REDRIVEN = 11
    PURGED = 12
    GIVEN_BACK = 13
    DROPPED = 14
    TOPPED_UP = 15
    ADVANCED = 16
    NOT_FOUND = -1
    STALE_EPOCH = -2
    LEASE_LOST = -3
    TOO_FAR = -4
    WRONG_STATE = -6
    EXPIRES_BEFORE_DUE = -7
    OVER_QUOTA = -8
    SLOT_MOVING = -9  # a batch item of a slot being moved (schedulemany-1): SlotMovingError

    @property
    def is_error(self) -> bool:
        return self < 0


class DelayqError(Exception):
    """Base of every error delayq raises on purpose."""


class BrokerFullError(DelayqError, redis.exceptions.OutOfMemoryError):
    """The broker's Redis is full (`maxmemory` with `noeviction`) and refused the write: nothing
    of that call is stored. Retry later: deliveries drain the broker and free memory.

    Still a redis-py `OutOfMemoryError` (a `ResponseError`), so code written against the Redis
    error keeps catching it; the text is Redis's own.
    """


#: The one name of the refusal of a write into a slot being moved to another broker: the Lua
#: error reply's first word (`lua/includes/refuse_if_moving.lua`), the HTTP error code, the
#: exception below.
SLOT_MOVING = "SLOT_MOVING"


class SlotMovingError(DelayqError, redis.ResponseError):
    """The slot is being moved to another broker (`delayq routing move-slot`): its broker
    refused the write, nothing of that call's slot is stored. Retry against the routing once it
    names the slot's new broker (the delay service does that itself); the move takes seconds.

    Still a redis-py `ResponseError`, as BrokerFullError, so code catching Redis errors keeps
    working; the text is the script's own (it names the slot's epoch key).
    """


class ReplicationTimeoutError(DelayqError):
    """A topic with `redis_sync_replicas` N: the write ran on the broker's master, but fewer than N
    replicas confirmed it within `redis_sync_timeout_ms`, so a master failing now may lose it.

    The write may have happened (it did on the master): retrying is safe, since every write is
    idempotent or answers its own repeat (create-only schedule answers EXISTS, a second ack
    LEASE_LOST). `result` is what the call answered on the master (or the refusal it raised);
    `confirmed` how many replicas had it in time.
    """

    def __init__(self, wanted: int, confirmed: int, timeout_ms: int, result: object) -> None:
        super().__init__(
            f"written on the broker's master but confirmed by {confirmed} of {wanted} replicas "
            f"within {timeout_ms} ms: it may be lost if the master fails now; retrying is safe"
        )
        self.wanted = wanted
        self.confirmed = confirmed
        self.timeout_ms = timeout_ms
        self.result = result


# Redis's words for a write refused over maxmemory: "OOM command not allowed when used memory >
# 'maxmemory'." (redis-py: OutOfMemoryError), with a "script: ..." tail when a script's call was
# refused; older servers wrap a script's refusal in "ERR Error running script ...".
OUT_OF_MEMORY_TEXT = "command not allowed when used memory > 'maxmemory'"


def as_typed_error(error: Exception) -> Exception:
    """`error` as a BrokerFullError when it is Redis refusing a write over maxmemory, as a
    SlotMovingError when a script refused a slot being moved, else `error` itself."""
    if isinstance(error, DelayqError) or not isinstance(error, redis.ResponseError):
        return error
    typed: Exception
    if isinstance(error, redis.exceptions.OutOfMemoryError) or OUT_OF_MEMORY_TEXT in str(error):
        typed = BrokerFullError(str(error))
    elif str(error).startswith(SLOT_MOVING):
        typed = SlotMovingError(str(error))
    else:
        return error
    typed.__cause__ = error
    return typed


class InvalidMessageError(DelayqError, ValueError):
    """A message was refused before reaching Redis; the text names the field and the bound."""


class ScriptRefusedError(DelayqError):
    """A Lua transition refused a message (or a schedule: `subject`); the text names the
    operation as the API does (`reschedule`, not the script's file `reschedule-7`), the id and
    the code."""

    code: Code = Code.OK

    def __init__(
        self, script: str, message_id: str, detail: str = "", subject: str = "message"
    ) -> None:
        self.script = script
        self.message_id = message_id
        operation = re.sub(r"-[0-9]+$", "", script)  # a script's file name ends in its keys
        text = f"{operation}: {subject} {message_id!r}: {self.code.name}"
        super().__init__(f"{text} ({detail})" if detail else text)


class NotFoundError(ScriptRefusedError):
    code = Code.NOT_FOUND


class StaleEpochError(ScriptRefusedError):
    """The slot has a newer owner: this process must stop consuming it."""

    code = Code.STALE_EPOCH


class LeaseLostError(ScriptRefusedError):
    """The lease is gone (expired and claimed again, cancelled, rescheduled or already acked)."""

    code = Code.LEASE_LOST


class TooFarError(ScriptRefusedError):
    code = Code.TOO_FAR


class WrongStateError(ScriptRefusedError):
    code = Code.WRONG_STATE


class ExpiresBeforeDueError(ScriptRefusedError):
    """The message's expiry is not after its due time: it could never be delivered."""

    code = Code.EXPIRES_BEFORE_DUE


class OverQuotaError(ScriptRefusedError):
    """The topic's limits.maxPending is reached (its share in the message's slot): nothing was
    stored. Retry later: deliveries make room."""

    code = Code.OVER_QUOTA


_ERRORS: dict[Code, type[ScriptRefusedError]] = {
    cls.code: cls
    for cls in (
        NotFoundError,
        StaleEpochError,
        LeaseLostError,
        TooFarError,
        WrongStateError,
        ExpiresBeforeDueError,
        OverQuotaError,
    )
}


def raise_for_code(
    code: Code, script: str, message_id: str, detail: str = "", subject: str = "message"
) -> None:
    """Raise the exception of a refusal code; do nothing for a transition code."""
    if code.is_error:
        raise _ERRORS[code](script, message_id, detail, subject)
