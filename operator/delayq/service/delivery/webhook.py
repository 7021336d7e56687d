"""Webhook delivery: POST each due message as signed JSON; 2xx acks, anything else retries.

One pool of keep-alive connections per topic (`http_post.PostClient`), a semaphore bounding
concurrent POSTs (the per-topic concurrency limit), and a total timeout per POST so a hung
receiver costs a retry, not a slot.

Batches (`max_batch` > 1, for receivers that accept them): the messages waiting for a POST slot
go out together, up to `max_batch` per POST, as `{"messages": [...]}`, and the receiver answers
each one (`{"results": [{"id": ..., "status": 200}, ...]}`): a 2xx status acks that message,
a 429 or 503 with a `retryAfter` is that message's Retry-After (given back, no attempt counted,
the topic held), anything else, or no answer for it, retries it alone. Batches form only while
every POST slot is busy, so a quiet topic still sends each message at once, and a busy one
spends one request on many messages (docs/service.md, "Batched webhooks").

A message may wait for the semaphore; once it has a turn, the sink asks `lease_deadline` whether
its lease is still valid and its slot still owned, and sends nothing otherwise (`LeaseGoneError`:
the consumer gives it back). A slot released meanwhile ends its messages' waits at once
(`abandon`), so that a handoff waits only for what was sent. The deadline travels in
`X-Delayq-Lease-Deadline` (unix ms, Redis clock) so a receiver knows how long its answer may take
before the message is redelivered. The signature's timestamp (`webhook-timestamp`, Standard
Webhooks: signing.py) is taken then, on the Redis server clock the consumer estimates (`clock_ms`),
so a pod whose own clock is off never fails receivers' checks. The topic's extra headers (an
`Authorization` the receiver wants) ride along on every POST.

SSRF guard: the client resolves the host itself and drops every address the topic's
`TargetPolicy` refuses, so each connection goes to an address that was checked, with no second
lookup in between (DNS rebinding cannot slip a private address past the check); an IP literal,
in any form the C library reads, is checked as it resolves. Redirects are not followed: a 3xx
is a failed delivery like any non-2xx, so a receiver cannot send the POST on to an address of
its choosing. A refused target is a failed delivery naming the address: the
message is retried with the usual backoff, so a tenant who fixes the topic sees it recover.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple

import redis

from delayq.queue.consumer import GiveBackError, LeaseGoneError
from delayq.queue.model import Message
from delayq.queue.pacing import MAX_HELD_MS, MAX_HOLD_MS
from delayq.queue.topic import Topic
from delayq.service.delivery.adaptive import AdaptiveLimit
from delayq.service.delivery.http_post import PostClient, PostError
from delayq.service.delivery.signing import Signer
from delayq.service.delivery.sinks import DeliveryError
from delayq.service.delivery.targets import TargetPolicy, TargetRefusedError
from delayq.service.envelope import header_id, message_body
from delayq.service.metrics import ServiceMetrics
from delayq.service.redaction import redact_url, without_url

SlotClock = Callable[[int], float]  # slot -> ms on the clock of the Redis server storing it
Waiting = tuple[Message, asyncio.Future[None]]  # a message and the wait for its answer
#: The reply to a single POST is not needed (its status decides): at most this much is read,
#: so a short one leaves the connection reusable; a longer one closes it.
SINGLE_REPLY_BYTES = 64 * 1024
BATCH_REPLY_BASE_BYTES = 64 * 1024
BATCH_REPLY_BYTES_PER_MESSAGE = 4 * 1024
#: The answers whose Retry-After holds the topic: too many requests, unavailable.
HOLD_STATUSES = frozenset({429, 503})
#: A hold lasts this long at least: `Retry-After: 0` must not make the pods spin.
MIN_HOLD_MS = 100


class ReceiverHoldError(GiveBackError):
    """The receiver asked for time (429 or 503 with Retry-After): the message was not
    delivered, so it is given back, no attempt counted, and the topic is held."""


def retry_after_ms(value: str | None, now_s: float) -> int | None:
    """A Retry-After header in ms from `now_s` (unix seconds): delay-seconds (`120`) or an
    HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`, past: 0); None when absent or unreadable (the
    answer is then an ordinary failure)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return int(value[:9]) * 1000  # beyond 9 digits the hold's bound applies anyway
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # a year past a C long
        return None
    if when.tzinfo is None:
        return None
    return max(0, int((when.timestamp() - now_s) * 1000))


def wall_ms() -> int:
    return int(time.time() * 1000)


def lease_gone(message: Message) -> LeaseGoneError:
    """What a message not sent because its lease or slot went meanwhile raises: given back."""
    return LeaseGoneError(f"{message.id}: lease gone while waiting for a POST slot")


def host_clock(_slot: int) -> float:
    """This host's clock, for a sink used outside a delay service (tests, tools)."""
    return time.time() * 1000


def no_deadline(_message: Message) -> float | None:
    """For a sink used outside a delay service: no lease to honour, sent as 0."""
    return 0.0


class WebhookSink:
    def __init__(
        self,
        topic: Topic,
        url: str,
        signer: Signer,
        timeout_ms: int,
        concurrency: int,
        metrics: ServiceMetrics,
        member: str = "",
        clock_ms: SlotClock = host_clock,
        lease_deadline: Callable[[Message], float | None] = no_deadline,
        *,
        targets: TargetPolicy,
        extra_headers: Mapping[str, str] | None = None,
        max_batch: int = 1,
        hold: Callable[[int], Awaitable[None]] | None = None,
        max_hold_ms: int = MAX_HOLD_MS,
        max_held_ms: int = MAX_HELD_MS,
        trace_headers: Callable[[dict[str, str]], None] | None = None,
        held: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.topic = topic
        # adds the current delivery span's `traceparent` to a single message's POST (None:
        # tracing off); a batch POST carries each message's context in its body only
        self.trace_headers = trace_headers
        self.url = url
        self.shown_url = redact_url(url)  # what errors and logs name: no credentials
        self.signer = signer
        self.extra_headers = dict(extra_headers or {})
        self.metrics = metrics
        self.member = member
        self.clock_ms = clock_ms
        self.lease_deadline = lease_deadline
        self._limit = AdaptiveLimit(concurrency)
        self.hold = hold  # the topic's pace: holds every pod's delivery (None: never held)
        self.held = held  # whether a hold lasts: nothing is sent meanwhile (`Pacer.held`)
        self.max_hold_ms = max_hold_ms
        self.max_held_ms = max_held_ms  # past its due: holds then cost the message attempts
        metrics.set_webhook_concurrency(concurrency)
        self.max_batch = max_batch
        self._waiting: list[Waiting] = []
        # slot -> the waits for a POST slot not taken yet (alone or for a batch) and their
        # messages: what `abandon` ends when the slot is released
        self._queued: dict[int, dict[asyncio.Future[None], Message]] = {}
        self._unanswered: set[asyncio.Future[None]] = set()  # every wait not settled yet
        self._has_waiting = asyncio.Event()
        self._batcher: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._client = PostClient(url, targets, timeout_ms)

    async def deliver(self, message: Message) -> None:
        """POST the message (alone or in a batch). A receiver's hold gives it back, no attempt
        spent, until it is `max_held_ms` overdue; after that each hold is a failed attempt,
        so its retry policy ends it rather than a receiver answering 429 for ever."""
        try:
            if self.max_batch > 1:
                await self._deliver_in_batch(message)
            else:
                await self._deliver_alone(message)
        except ReceiverHoldError as error:
            overdue_ms = int(self.clock_ms(message.slot) - message.due_ms)
            if overdue_ms <= self.max_held_ms:
                raise
            raise DeliveryError(
                f"{error}; {overdue_ms} ms overdue, over the {self.max_held_ms} ms a message "
                "may be held: a failed attempt"
            ) from None

    async def _deliver_alone(self, message: Message) -> None:
        body = message_body(self.topic, message)
        message_id = header_id(message.id)
        headers = {
            **self.extra_headers,
            "Content-Type": "application/json",
            "X-Delayq-Id": message_id,
            "X-Delayq-Attempt": str(message.attempt),
            "X-Delayq-Member": self.member,
        }
        if self.trace_headers is not None:
            self.trace_headers(headers)
        await self._turn(message)
        try:
            deadline_ms = self.lease_deadline(message)
            if deadline_ms is None:
                raise lease_gone(message)
            if await self._holding():
                raise ReceiverHoldError(f"{message.id}: not sent, the receiver's hold lasts")
            headers["X-Delayq-Lease-Deadline"] = str(int(deadline_ms))
            if self.signer:
                timestamp_s = int(self.clock_ms(message.slot) // 1000)
                headers.update(self.signer.headers(message_id, timestamp_s, body))
            started = time.monotonic()
            status, _, retry_after = await self._post(body, headers, started, SINGLE_REPLY_BYTES)
        finally:
            self._limit.release()
        if not 200 <= status < 300:
            raise await self._refused(status, retry_after_ms(retry_after, time.time()))

    async def _turn(self, message: Message) -> None:
        """Take a POST slot for `message` (the caller releases it); LeaseGoneError when its
        slot is released while it waits for one (`abandon`)."""
        if self._limit.try_acquire():
            return
        abandoned: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue(message, abandoned)
        try:
            granted = await self._limit.acquire(abandoned)
        finally:
            self._unqueue(message, abandoned)
            if abandoned.done():
                abandoned.exception()  # read: the outcome is `granted` (a slot won the race)
        if not granted:
            raise lease_gone(message)

    def abandon(self, slots: frozenset[int]) -> None:
        """The consumer released `slots`: their messages still waiting for a POST slot, alone
        or for a batch, stop waiting (LeaseGoneError: given back at once, for the slots' next
        owner) rather than hold the handoff until POST slots free, which under a slow receiver
        (the limit shrunk to 1, the other slots' POSTs queued first) took the handoff's whole
        drain. A POST already sent is waited for as before. Checked message by message: a
        doubling's halves share this sink, and their slot numbers are another generation's."""
        for slot in slots:
            for wait, message in list(self._queued.get(slot, {}).items()):
                if not wait.done() and self.lease_deadline(message) is None:
                    wait.set_exception(lease_gone(message))

    def _queue(self, message: Message, wait: asyncio.Future[None]) -> None:
        """Record a wait for a POST slot (`abandon` ends it), until `_unqueue`."""
        self._queued.setdefault(message.slot, {})[wait] = message

    def _unqueue(self, message: Message, wait: asyncio.Future[None]) -> None:
        queued = self._queued.get(message.slot)
        if queued is not None:
            queued.pop(wait, None)
            if not queued:
                del self._queued[message.slot]

    async def _deliver_in_batch(self, message: Message) -> None:
        """Wait for the batcher to send the message with the others waiting, and for the
        receiver's answer to it. A cancelled or abandoned wait (the slot released) leaves it
        unsent."""
        if self._batcher is None:
            self._batcher = asyncio.create_task(self._form_batches())
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unanswered.add(answered)
        answered.add_done_callback(self._unanswered.discard)
        self._waiting.append((message, answered))
        self._queue(message, answered)
        self._has_waiting.set()
        try:
            await answered
        finally:
            self._unqueue(message, answered)  # if `_take_batch` did not

    async def _form_batches(self) -> None:
        """Take a POST slot, then every message waiting (up to `max_batch`): while all slots
        are busy, messages pile up and leave together when one frees."""
        while True:
            await self._has_waiting.wait()
            await self._limit.acquire()
            batch = self._take_batch()
            if not self._waiting:
                self._has_waiting.clear()
            if not batch:
                self._limit.release()
                continue
            task = asyncio.create_task(self._send_batch(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    def _take_batch(self) -> list[Waiting]:
        """Up to `max_batch` waiting messages, oldest first, at most one per id: the receiver
        answers by id, so a second message of the same id (another slot basis) waits for the
        next batch rather than take the first one's answer. Cancelled waits are dropped."""
        batch: list[Waiting] = []
        ids: set[str] = set()
        kept: list[Waiting] = []
        for message, answered in self._waiting:
            if answered.done():
                continue
            if len(batch) < self.max_batch and message.id not in ids:
                batch.append((message, answered))
                ids.add(message.id)
                self._unqueue(message, answered)  # taken: sent, no longer to abandon
            else:
                kept.append((message, answered))
        self._waiting = kept
        return batch

    async def _send_batch(self, batch: list[Waiting]) -> None:
        """POST one batch (holding the slot `_form_batches` took) and settle every message's
        wait with the receiver's answer to it. A wait cancelled meanwhile is skipped: its
        message is neither sent nor answered."""
        try:
            if await self._holding():
                for message, answered in batch:
                    if not answered.done():
                        answered.set_exception(
                            ReceiverHoldError(f"{message.id}: not sent, the receiver's hold lasts")
                        )
                return
            sent: list[Waiting] = []
            deadlines: list[float] = []
            for message, answered in batch:
                if answered.done():
                    continue
                deadline_ms = self.lease_deadline(message)
                if deadline_ms is None:
                    answered.set_exception(lease_gone(message))
                else:
                    sent.append((message, answered))
                    deadlines.append(deadline_ms)
            if not sent:
                return
            bodies = [message_body(self.topic, message) for message, _ in sent]
            body = b'{"messages":[' + b",".join(bodies) + b"]}"
            batch_id = "batch_" + hashlib.sha256(b"\n".join(bodies)).hexdigest()[:32]
            headers = {
                **self.extra_headers,
                "Content-Type": "application/json",
                "X-Delayq-Batch-Size": str(len(sent)),
                "X-Delayq-Member": self.member,
                "X-Delayq-Lease-Deadline": str(int(min(deadlines))),
            }
            if self.signer:
                timestamp_s = int(self.clock_ms(sent[0][0].slot) // 1000)
                headers.update(self.signer.headers(batch_id, timestamp_s, body))
            try:
                limit = batch_reply_bytes(len(sent))
                status, reply, retry_after = await self._post(
                    body, headers, time.monotonic(), limit
                )
                if not 200 <= status < 300:
                    raise await self._refused(status, retry_after_ms(retry_after, time.time()))
                if reply is None:
                    raise DeliveryError(
                        f"POST {self.shown_url}: HTTP {status}, its reply over {limit} bytes "
                        "or cut off"
                    )
                answers = batch_answers(reply, time.time())
            except (DeliveryError, ReceiverHoldError) as error:
                for _, answered in sent:
                    if not answered.done():
                        answered.set_exception(error)
                return
            await self._settle(sent, answers)
        finally:
            self._limit.release()
            for _, answered in batch:  # only on a bug above: never leave a delivery waiting
                if not answered.done():
                    answered.set_exception(DeliveryError(f"POST {self.shown_url}: batch not sent"))

    async def _settle(self, sent: list[Waiting], answers: dict[str, BatchAnswer]) -> None:
        """Each message of a batch by its answer: a 2xx acks it; a 429 or 503 asking for time
        gives it back, no attempt counted, and holds the topic (once, for the longest time
        asked: as that answer to its own POST would); anything else, or no answer, fails it."""
        asked = [
            answer.hold_ms
            for answer in answers.values()
            if answer.status in HOLD_STATUSES and answer.hold_ms is not None
        ]
        held = await self._hold_for(429, max(asked)) if asked else None
        for message, answered in sent:
            if answered.done():
                continue
            answer = answers.get(message.id)
            if answer is not None and 200 <= answer.status < 300:
                answered.set_result(None)
            elif held is not None and answer is not None and answer.hold_ms is not None and (
                answer.status in HOLD_STATUSES
            ):
                answered.set_exception(held)
            else:
                said = "no answer for it" if answer is None else f"status {answer.status}"
                answered.set_exception(
                    DeliveryError(f"POST {self.shown_url}: batch reply gave {said}")
                )

    async def _holding(self) -> bool:
        """A receiver's hold lasts: messages claimed before it are given back, not sent (no
        attempt counted), and claimed again once it ends."""
        return self.held is not None and await self.held()

    async def _hold_for(self, status: int, asked_ms: int) -> Exception | None:
        """A 429 or 503 asking for `asked_ms`: holds every pod's delivery that long (bounded,
        `Pacer.hold`) and answers the error that gives its messages back, no attempt counted;
        None when the topic is never held (no pace) or the status asks for nothing. When Redis
        refuses the hold (the first broker down or just restarted) only this process is held
        (`Pacer.hold` holds it first) and the messages are given back all the same: the
        receiver asked for time, which is no failed attempt (the other pods learn it from their
        own 429s; `max_held_ms` still bounds how long holds may park a message)."""
        if status not in HOLD_STATUSES or self.hold is None:
            return None
        hold_ms = max(MIN_HOLD_MS, min(asked_ms, self.max_hold_ms))
        try:
            await self.hold(hold_ms)
        except redis.RedisError as error:
            return ReceiverHoldError(
                f"POST {self.shown_url}: HTTP {status}, held {hold_ms} ms by this process only "
                f"(not shared: {error})"
            )
        return ReceiverHoldError(f"POST {self.shown_url}: HTTP {status}, held {hold_ms} ms")

    async def _refused(self, status: int, asked_ms: int | None) -> Exception:
        """What a non-2xx answer makes of its messages. A 429 or 503 with a Retry-After
        (`asked_ms`) the topic may honour holds it (`_hold_for`); otherwise the delivery failed
        (retried with backoff), and a 5xx halves the POSTs in flight (`AdaptiveLimit`)."""
        held = None if asked_ms is None else await self._hold_for(status, asked_ms)
        if held is not None:
            return held
        if status >= 500:
            self._limit.shrink()
            self.metrics.set_webhook_concurrency(self._limit.size)
        return DeliveryError(f"POST {self.shown_url}: HTTP {status}")

    @property
    def concurrency(self) -> int:
        """POSTs allowed in flight now (the adaptive limit, at most maxInFlight)."""
        return self._limit.size

    def _failed(self, error: Exception) -> DeliveryError:
        """A client error as a delivery failure, every copy of the URL in it redacted."""
        said = without_url(str(error), self.url) or "no answer in time"
        return DeliveryError(f"POST {self.shown_url}: {type(error).__name__}: {said}")

    async def _post(
        self, body: bytes, headers: dict[str, str], started: float, reply_limit: int
    ) -> tuple[int, bytes | None, str | None]:
        """The receiver's status, reply and Retry-After header. The reply is None when over
        `reply_limit` bytes or cut off (reset, or the timeout while it trickles in), read no
        further: a receiver
        cannot make the sender buffer what it likes (64 POSTs of a gigabyte each). A single
        POST's answer is its status alone, so a 2xx followed by an endless or broken body
        still acks; a batch without its whole reply has no answers (`_send_batch`)."""
        try:
            status, reply, retry_after = await self._client.post(body, headers, reply_limit)
        except TargetRefusedError as error:
            self._observe("refused", started)
            raise DeliveryError(f"POST {self.shown_url}: {error}") from error
        except (PostError, TimeoutError) as error:
            self._observe("error", started)
            if isinstance(error, TimeoutError):
                self._limit.shrink()
                self.metrics.set_webhook_concurrency(self._limit.size)
            raise self._failed(error) from error
        self._observe(f"{status // 100}xx", started)
        if 200 <= status < 300:
            self._limit.grow()
            self.metrics.set_webhook_concurrency(self._limit.size)
        return status, reply, retry_after

    def _observe(self, status: str, started: float) -> None:
        self.metrics.observe_webhook(status, time.monotonic() - started)

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
        for task in list(self._batches):
            task.cancel()
        for answered in list(self._unanswered):  # a batch cancelled before it ran settles none
            answered.cancel()
        await self._client.close()


def batch_reply_bytes(messages: int) -> int:
    """The largest batch reply read: room for an answer per message with a long id and a
    reason beside its status, and a fixed margin; a larger one fails the batch."""
    return BATCH_REPLY_BASE_BYTES + BATCH_REPLY_BYTES_PER_MESSAGE * messages


class BatchAnswer(NamedTuple):
    """A batch reply's answer to one message."""

    status: int
    # a 429's or 503's `retryAfter`, in ms from now: the message's own Retry-After (None:
    # absent or unreadable, the answer is then an ordinary failure)
    hold_ms: int | None = None


def batch_answers(reply: bytes, now_s: float) -> dict[str, BatchAnswer]:
    """Message id -> answer from a batch reply `{"results": [{"id": ..., "status": ...}]}`,
    where a result may add `"retryAfter"`: whole seconds, or a string as the Retry-After header
    (seconds or an HTTP date, from `now_s`).

    Only that exact shape counts: an id that is a string and a status that is an integer (not
    `"200"`, `299.9` or `true`, which a lenient reading would take for a 2xx), a `retryAfter`
    that is an integer or a string, and one answer per id (repeating it alike is harmless). A
    reply of any other shape, or answering one id both ways, is a failed delivery of the whole
    batch: never an ack the receiver did not give.
    """
    try:
        results: Any = json.loads(reply)["results"]
        if not isinstance(results, list):
            raise TypeError("results is not a list")
        answers: dict[str, BatchAnswer] = {}
        for result in results:
            message_id, status = result["id"], result["status"]
            if not isinstance(message_id, str) or type(status) is not int:
                raise TypeError("an id that is not a string or a status that is not an integer")
            retry_after = result.get("retryAfter")
            if retry_after is not None and type(retry_after) not in (int, str):
                raise TypeError("a retryAfter that is neither an integer nor a string")
            answer = BatchAnswer(
                status, None if retry_after is None else retry_after_ms(str(retry_after), now_s)
            )
            if answers.setdefault(message_id, answer) != answer:
                raise ValueError(f"two different answers for id {message_id!r}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise DeliveryError(
            f'batch reply is not {{"results": [{{"id": ..., "status": ...}}]}}: '
            f"{type(error).__name__}: {str(error)[:200]}"
        ) from None
    return answers
