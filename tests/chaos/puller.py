"""The pull consumers of the chaos suite: what the receiver is to a webhook topic, for a pull one.

`CONSUMERS` long-polling consumers per serve process, each doing what the documented consumer
does (examples/service/pull_consumer.py): lease with the previous batch's tokens in `ack`,
handle, repeat; a failed request sends the same tokens again with the next one. Each leased
message is an `Arrival` when the answer is read (on the real clock, as the receiver's), and the
fault injector's `Behaviour` decides its handling as it decides a POST's answer: slow (sleep,
then ack), an error (nack: the retry policy's backoff) or fine (ack).

An arrival's status is what the service said of its ack, not what the consumer decided: 204
once an answer reports it `acked`, 409 when it reports the lease lost (or fenced), 503 when the
consumer nacked it. The lost rule then judges the service: a message whose ack was refused and
that never came again is lost. One case is ambiguous, as the service docs say: a request that
failed may have applied its acks, so the same tokens sent again can answer `lease_lost` for a
message that is done. Such an arrival is settled by the message's state (`resolve`): `done`
by the ack of this very attempt (the remembered outcome keeps the attempt it finished) makes it
204; anything else leaves it 409 (the message came again, or comes).

A lease carries no deadline; the arrival's is the consumer's `ackTimeoutMs` after it arrived,
an upper bound (the claim came first), and its signing time is its arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .cluster import ACK_TIMEOUT_MS, TOPIC, Member
from .receiver import Arrival, Behaviour, now_ms

CONSUMERS = 2  # per serve process
LEASE_MAX = 20
WAIT_MS = 1000
REQUEST_SLACK_S = 10.0  # past waitMs: only a frozen or cut process makes a request time out
PAUSE_S = 0.2  # after a failed request
RESOLVE_EVERY_S = 0.5


@dataclass
class Puller:
    behaviour: Behaviour = field(default_factory=Behaviour)
    arrivals: list[Arrival] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    # message id -> its arrival whose ack's outcome is unknown (`resolve`)
    ambiguous: dict[str, Arrival] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ""  # the serve processes POST nowhere: a pull topic

    async def start(self, members: list[Member]) -> Puller:
        self._session = aiohttp.ClientSession()
        for member in members:
            for _ in range(CONSUMERS):
                self._tasks.append(asyncio.create_task(self._consume(member)))
        self._tasks.append(asyncio.create_task(self._resolve_forever(members)))
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _consume(self, member: Member) -> None:
        """One consumer of `member`: lease, handle, repeat, as the documented one."""
        assert self._session is not None
        url = f"{member.url}/v1/topics/{TOPIC}/leases"
        done: list[tuple[str, Arrival]] = []  # handled, its ack not answered yet
        resent = False  # `done` went with a request that failed: its acks may have applied
        timeout = aiohttp.ClientTimeout(total=WAIT_MS / 1000 + REQUEST_SLACK_S)
        while True:
            body = {
                "max": LEASE_MAX,
                "ackTimeoutMs": ACK_TIMEOUT_MS,
                "waitMs": WAIT_MS,
                "ack": [token for token, _ in done],
            }
            answer = await self._post(url, body, timeout)
            if answer is None:
                resent = resent or bool(done)
                await asyncio.sleep(PAUSE_S)
                continue
            at = now_ms()
            self._settle(done, answer.get("acks", []), resent)
            done, resent = [], False
            leased = [
                (lease["token"], self._arrive(lease, member.name, at)) for lease in answer["leases"]
            ]
            handled = await asyncio.gather(*(self._handle(arrival) for _, arrival in leased))
            done = [pair for pair, ok in zip(leased, handled, strict=True) if ok]
            failed = [token for (token, _), ok in zip(leased, handled, strict=True) if not ok]
            if failed:  # best effort: a nack lost leaves the lease to run out (an attempt)
                await self._post(f"{url}/nack", {"tokens": failed}, timeout)

    async def _post(
        self, url: str, body: dict[str, Any], timeout: aiohttp.ClientTimeout
    ) -> dict[str, Any] | None:
        """The answer of a 200 or a 409 (a batch with a lost lease), else None."""
        assert self._session is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with self._session.post(url, json=body, timeout=timeout) as response:
                if response.status in (200, 409):
                    answer: dict[str, Any] = await response.json()
                    return answer
        return None

    def _arrive(self, lease: dict[str, Any], member: str, at_ms: float) -> Arrival:
        arrival = Arrival(
            message_id=lease["id"],
            attempt=int(lease["attempt"]),
            member=member,
            at_ms=at_ms,
            signed_ms=int(at_ms),
            due_ms=int(lease["dueMs"]),
            lease_deadline_ms=int(at_ms) + ACK_TIMEOUT_MS,
        )
        self.arrivals.append(arrival)
        return arrival

    async def _handle(self, arrival: Arrival) -> bool:
        """True to ack, False to nack (the arrival's status then 503), as the behaviour says."""
        behaviour = self.behaviour
        if behaviour.only is not None and arrival.member not in behaviour.only:
            behaviour = Behaviour()
        if behaviour.slow_s is not None:
            await asyncio.sleep(self.rng.uniform(*behaviour.slow_s))
        if behaviour.retry_after_s is not None or self.rng.random() < behaviour.error_rate:
            arrival.status, arrival.answered_ms = 503, now_ms()
            return False
        return True

    def _settle(
        self, done: list[tuple[str, Arrival]], results: list[dict[str, Any]], resent: bool
    ) -> None:
        """Each handled arrival's status from its ack's result (by position, as answered)."""
        for (_, arrival), result in zip(done, results, strict=False):
            arrival.answered_ms = now_ms()
            if result.get("result") == "acked":
                arrival.status = 204
            else:
                arrival.status = 409
                if resent:
                    self.ambiguous[arrival.message_id] = arrival

    async def _resolve_forever(self, members: list[Member]) -> None:
        while True:
            await asyncio.sleep(RESOLVE_EVERY_S)
            await self.resolve(members)

    async def resolve(self, members: list[Member]) -> None:
        """Settle the ambiguous arrivals by their messages' state, asked of any process."""
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=2.0)
        for message_id, arrival in list(self.ambiguous.items()):
            for member in members:
                url = f"{member.url}/v1/topics/{TOPIC}/messages/{message_id}"
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with self._session.get(url, timeout=timeout) as response:
                        if response.status != 200:
                            continue
                        info = await response.json()
                    if acked_by(info, arrival.attempt):
                        arrival.status = 204
                    del self.ambiguous[message_id]  # else its lease is gone: it came again
                    break


def acked_by(info: dict[str, Any], attempt: int) -> bool:
    """Whether a message's state (its GET by id) says the ack of `attempt` finished it. The
    remembered outcome keeps the attempt its ack finished: this lease's, or a later lease's,
    whose own answer may not have been read yet (then `done` alone would count one ack twice)."""
    return info.get("state") == "done" and info.get("attempts") == attempt
