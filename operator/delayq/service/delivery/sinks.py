"""What a push delivery (webhook or stream) looks like to the service: one awaitable per message.

The engine's `Consumer` calls the sink for each claimed message: returning acks it, raising nacks
it with backoff (and past maxRetries sends it to dead), so a sink only has to say yes or no.
"""

from __future__ import annotations

from typing import Protocol

from delayq.queue.model import Message


class DeliveryError(Exception):
    """The sink refused or did not answer: the message is retried later."""


class Sink(Protocol):
    async def deliver(self, message: Message) -> None:
        """Hand the message over; raise to have it retried."""

    def abandon(self, slots: frozenset[int]) -> None:
        """The engine released `slots`: a message of them still waiting for its turn (not
        sent) stops waiting, raising LeaseGoneError, so that the handoff does not wait for it."""

    async def close(self) -> None:
        """Release connections once no delivery runs any more."""
