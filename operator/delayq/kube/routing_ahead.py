"""`status.routing` kept ahead of the switches of the operator's own moves and doublings.

The health pass writes the status copy of the routing (routing_record.py) at its end, from
ZooKeeper; its moves and doublings switch the routing in the middle of it. From a switch on, the
messages are only where the new routing says: new writes go to the target (or the new key
generation), and the clean deletes the source. A copy still naming the source, published again
after ZooKeeper lost its data, would be worse than stale: the next pass would plan the same move
(or doubling) again, whose copy replaces the target's messages with the source's tombstone.

So each mover calls `moving` (a doubling `doubling`) in its thread right before its switch and
before its clean, when its copy is complete, and goes on only once status.routing names the
routing after the switch: ZooKeeper's routing now, with every switch of this pass applied. A
failed patch stops the move before its switch (MoveError, recorded; the next pass resumes it).
The copy is then ahead of ZooKeeper until the switch, which is safe: the target holds the whole
slot from the copy on, and the source refuses every write (frozen). docs/operator.md, "When
ZooKeeper loses its data", lists what stays uncovered.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from delayq.coordination.migration import MoveError
from delayq.coordination.routing import Move, Routing
from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.routing_record import RECORD_FIELD, routing_record
from delayq.kube.spec import TopicSpec
from delayq.kube.topics import API_VERSION

RECORD_TIMEOUT_S = 10.0  # bounds one status patch a mover waits for
#: Writes the copy: the health pass's patches status.routing (`status_writer`).
RecordRouting = Callable[[Routing], Coroutine[Any, Any, None]]


def status_writer(ctx: OperatorContext, spec: TopicSpec) -> RecordRouting:
    """The writer of the topic's status.routing (raises while this replica does not lead)."""

    async def write(routing: Routing) -> None:
        patch = {"status": {RECORD_FIELD: routing_record(routing)}}
        await ctx.kube.patch_status(API_VERSION, naming.KIND, spec.namespace, spec.name, patch)

    return write


class RoutingAhead:
    """One pass's recorder of the routing its movers are about to switch to: `write` runs on
    `loop`; `read` gives ZooKeeper's routing now (blocking, called in the movers' threads)."""

    def __init__(
        self,
        write: RecordRouting,
        loop: asyncio.AbstractEventLoop,
        read: Callable[[], Routing],
    ) -> None:
        self.write, self.loop, self.read = write, loop, read
        self.written: Routing | None = None  # the last routing patched into status.routing
        self._switching: dict[int, int] = {}  # slot -> target, this pass's moves
        self._lock = threading.Lock()  # concurrent moves: each record has every switch

    def moving(self, move: Move) -> None:
        """Before the switch (or clean) of `move`: ZooKeeper's routing with this pass's moves."""
        with self._lock:
            self._switching[move.slot] = move.target
            routing = self.read()
            slots = list(routing.broker_of_slot)
            for slot, target in self._switching.items():
                slots[slot] = target
            self._record(replace(routing, broker_of_slot=tuple(slots)))

    def doubling(self, routing: Routing) -> None:
        """Before a doubling's switch (or clean): the doubled routing."""
        with self._lock:
            self._record(routing)

    def _record(self, routing: Routing) -> None:
        if routing == self.written:
            return
        future = asyncio.run_coroutine_threadsafe(self.write(routing), self.loop)
        try:
            future.result(RECORD_TIMEOUT_S)
        except Exception as error:
            future.cancel()
            raise MoveError(
                f"status.{RECORD_FIELD} not written before the switch "
                f"({type(error).__name__}: {error}); retried"
            ) from error
        self.written = routing
