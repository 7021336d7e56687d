"""A pull topic over two brokers whose Redis clocks differ by a few ms: each broker's due times
are timed on that broker's own clock.

One estimate for all brokers keeps the largest offset any reply gave (`ServerClock`), so it
ran ahead of the slower broker's clock by the skew: a lease waiting for that broker's message
woke up early, claimed, found nothing, and claimed again at once until the message was due, a
burst of claims for every due time of that broker.

redis-server does not run under libfaketime (its clock_gettime recursion), so broker 1's clock
is moved ahead in its claim replies: every time in them (`now_us`, next due and deadline) as a
server SKEW_MS ahead would have answered; the claims themselves are real.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue.backoff import Backoff
from delayq.queue.client import AsyncQueue
from delayq.queue.codes import StaleEpochError
from delayq.queue.model import ClaimBatch, SlotClaim
from tests.service.conftest import StartService

SKEW_MS = 3  # well below ServerClock.REBASE_MS: one estimate for all kept it for seconds
SLOTS = 4  # slots 0, 1 on broker 0, 2, 3 on broker 1
DELAY_MS = 100


def _ahead(queue: AsyncQueue) -> None:
    """`queue`'s claim replies read as from a server whose clock is SKEW_MS ahead."""
    claim_slots = queue.claim_slots

    def shifted(ms: int | None) -> int | None:
        return None if ms is None else ms + SKEW_MS

    async def claim_ahead(
        claims: Sequence[SlotClaim],
        ack_timeout_ms: int | None = None,
        backoff: Backoff | None = None,
    ) -> list[ClaimBatch | StaleEpochError]:
        return [
            outcome
            if isinstance(outcome, StaleEpochError)
            else dataclasses.replace(
                outcome,
                now_us=outcome.now_us + SKEW_MS * 1000,
                next_due_ms=shifted(outcome.next_due_ms),
                next_deadline_ms=shifted(outcome.next_deadline_ms),
            )
            for outcome in await claim_slots(claims, ack_timeout_ms, backoff)
        ]

    queue.claim_slots = claim_ahead  # type: ignore[method-assign]


async def test_each_brokers_clock_is_estimated_on_its_own_replies(
    redis_server: RedisServer, start_service: StartService
):
    """Broker 1's clock reads SKEW_MS ahead of broker 0's: the estimate of broker 0's clock,
    which times its slots' due times, never runs ahead of broker 0's clock, whatever broker 1
    answered; and a message of broker 0 is leased once due, not before."""
    with RedisServer() as second:
        running = await start_service(
            slot_amount=SLOTS, broker_urls=f"{redis_server.url},{second.url}"
        )
        _ahead(running.service.brokers.queues[1])
        leaser = running.service.leaser
        assert leaser is not None
        topic = running.service.topic
        leases = f"{running.base}/leases"
        on_0, on_1 = (
            [f"s{i}" for i in range(200) if (topic.slot_of(f"s{i}") < 2) is b]
            for b in (True, False)
        )
        for message_id in on_1[:10]:  # broker 1's claim replies, some of them prompt
            await running.client.post(
                f"{running.base}/messages", json={"id": message_id, "delayMs": 0}
            )
            answer = await running.client.post(leases, json={"max": 10, "waitMs": 1_000})
            assert [m["id"] for m in (await answer.json())["leases"]] == [message_id]
        created = await running.client.post(
            f"{running.base}/messages", json={"id": on_0[0], "delayMs": DELAY_MS}
        )
        assert created.status == 201
        answer = await running.client.post(leases, json={"max": 10, "waitMs": 5_000})
        [leased] = (await answer.json())["leases"]
        assert leased["id"] == on_0[0]
        slot_0, slot_1 = topic.slot_of(on_0[0]), topic.slot_of(on_1[0])
        estimates = leaser.server_now_ms(slot_0), leaser.server_now_ms(slot_1)
        server_0 = _now(redis_server)
        assert estimates[0] <= server_0, estimates[0] - server_0
        assert estimates[1] <= _now(second) + SKEW_MS
        assert server_0 >= leased["dueMs"]


def _now(server: RedisServer) -> float:
    client = redis.Redis.from_url(server.url)
    seconds, micros = client.time()
    client.close()
    return seconds * 1000 + micros / 1000
