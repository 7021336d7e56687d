"""Pull-consumer routes: lease a batch, then ack, nack (with delay) or extend by lease token.

Batch answers list a result per token; the status is 409 when any lease was lost or fenced
(the consumer must not assume its work counted), 200 otherwise.

A lease request may carry the previous answer's tokens in `ack`, so a steady consumer sends one
request per batch instead of a lease and an ack (half the requests, docs/benchmarks.md, "Pull
over HTTP"). They are acked before anything is leased, each reported in `acks`; a lost one does
not make the answer a 409, since the leases it carries are valid and must not be dropped.

A token names its slot's key generation (service/tokens.py): the lease of a doubling's half is
acked, nacked and extended in the halves' keys, and one whose keys a doubling froze for good
is answered `stale_epoch` at once (`DelayService.lease_brokers`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from delayq.queue.client import AsyncQueue
from delayq.queue.codes import Code
from delayq.queue.model import Lease, MessageInfo, Outcome, Retry, Target
from delayq.queue.topic import TopicType
from delayq.service.brokers import Brokers
from delayq.service.delivery.pull import PullLeaser
from delayq.service.envelope import message_json
from delayq.service.http_support import (
    UnknownTopicError,
    json_body,
    json_response,
    service_for,
)
from delayq.service.parsing import (
    Body,
    parse_extend,
    parse_lease_request,
    parse_nack,
    parse_tokens,
)
from delayq.service.service import DelayService
from delayq.service.tokens import TokenLease

LEASES = "/v1/topics/{topic}/leases"
NACK_DELAY = "delayMs"  # absent: the topic's retry policy decides (_backoff_ms)
CONFLICTS = frozenset({Code.LEASE_LOST, Code.STALE_EPOCH, Code.NOT_FOUND})

R = TypeVar("R")


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(LEASES, lease)
    router.add_post(LEASES + "/ack", ack)
    router.add_post(LEASES + "/nack", nack)
    router.add_post(LEASES + "/extend", extend)


def _leaser(service: DelayService) -> PullLeaser:
    if service.leaser is None:
        raise UnknownTopicError(
            "topic",
            f"topic {service.topic.name!r} is a {service.topic.topic_type} topic, "
            f"leases are for {TopicType.PULL} topics",
        )
    return service.leaser


async def lease(request: web.Request) -> web.Response:
    service = service_for(request)
    leaser = _leaser(service)
    body = await json_body(request)
    wanted = parse_lease_request(
        body, service.topic, service.lease_tokens, service.config.pull_max_lease_batch
    )
    acked = None if wanted.acks is None else await _ack(service, wanted.acks)
    leased = await leaser.lease(wanted.max_count, wanted.ack_timeout_ms, wanted.wait_ms)
    if leased and _client_gone(request):
        await leaser.give_back(leased)
        leased = {}
    topic = service.topic
    encode = service.lease_tokens.encode
    leases = []
    for generation, messages in leased.items():  # the topic's slots, a doubling's halves
        for message in messages:
            lateness_ms = leaser.server_now_ms(message.slot, generation) - message.due_ms
            service.metrics.observe_lateness(lateness_ms, message.priority)
            if service.tracing is not None:
                service.tracing.leased(topic.name, message, lateness_ms)
        leases += [{"token": encode(m, generation), **message_json(topic, m)} for m in messages]
    service.metrics.count_delivery("leased", len(leases))
    if acked is None:
        return json_response({"leases": leases})
    return json_response({"leases": leases, "acks": _results(body["ack"], acked)})


def _slot(lease: Lease) -> int:
    return lease.slot


def _fenced(lease: Lease) -> Outcome:
    return Outcome(lease.id, Code.STALE_EPOCH)


async def _each_lease(
    service: DelayService,
    leases: Sequence[TokenLease],
    call: Callable[[AsyncQueue, list[Lease]], Awaitable[Sequence[R]]],
    refused: Callable[[Lease], R],
) -> list[R]:
    """`call` on the brokers of each lease's key generation, one call per broker and
    generation, results in the leases' order; a lease that can be applied no more (its keys
    frozen for good by a doubling: `DelayService.lease_brokers`) gets `refused(lease)`."""
    results: dict[int, R] = {}
    groups: dict[int, tuple[Brokers, list[int]]] = {}
    for index, (lease, generation) in enumerate(leases):
        brokers = service.lease_brokers(generation, lease.slot)
        if brokers is None:
            results[index] = refused(lease)
        else:
            groups.setdefault(generation, (brokers, []))[1].append(index)
    for brokers, indexes in groups.values():
        answers = await brokers.each([leases[i].lease for i in indexes], _slot, call)
        results.update(zip(indexes, answers, strict=True))
    return [results[index] for index in range(len(leases))]


def _client_gone(request: web.Request) -> bool:
    """The client closed the connection, as a consumer does when its own timeout is shorter
    than `waitMs`. aiohttp does not cancel a handler whose client went away, so a long poll
    waits on and leases what comes due into the closed connection, where nobody would have it
    until its lease ran out: such messages are given back (prepare -> store, no attempt
    counted), and the give-back's wake-up hands them to another poll."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _results(tokens: Sequence[str], outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """A result per token, in order, each carrying the token as sent (the parse checked every
    one, so echoing it is encoding it again, without the work)."""
    results: list[dict[str, Any]] = []
    for token, outcome in zip(tokens, outcomes, strict=True):
        result: dict[str, Any] = {"id": outcome.id, "result": outcome.code.name.lower()}
        if outcome.at_ms is not None:
            result["atMs"] = outcome.at_ms
        result["token"] = token
        results.append(result)
    return results


def _answer(body: Body, outcomes: Sequence[Outcome]) -> web.Response:
    conflict = any(outcome.code in CONFLICTS for outcome in outcomes)
    results = _results(body["tokens"], outcomes)
    return json_response({"results": results}, status=409 if conflict else 200)


async def _ack(service: DelayService, leases: Sequence[TokenLease]) -> list[Outcome]:
    """Ack `leases` (of the ack route or a lease request's `ack`), counted as acked."""
    outcomes = await _each_lease(service, leases, lambda q, chunk: q.ack_many(chunk), _fenced)
    service.metrics.count_delivery("acked", sum(o.code is Code.ACKED for o in outcomes))
    if service.tracing is not None:
        service.tracing.lease_acked(service.topic.name, [t.lease for t in leases], outcomes)
    return outcomes


async def ack(request: web.Request) -> web.Response:
    service = service_for(request)
    _leaser(service)
    body = await json_body(request)
    leases = parse_tokens(body, service.topic, service.lease_tokens)
    return _answer(body, await _ack(service, leases))


async def nack(request: web.Request) -> web.Response:
    service = service_for(request)
    _leaser(service)
    body = await json_body(request)
    wanted = parse_nack(body, service.topic, service.lease_tokens)
    delays = {} if NACK_DELAY in body or wanted.dead else await _backoff_ms(service, wanted.leases)

    def retry(lease: Lease) -> Retry:
        return Retry(lease, delays.get(lease, wanted.delay_ms), wanted.reason, wanted.dead)

    def nack_chunk(queue: AsyncQueue, chunk: list[Lease]) -> Awaitable[list[Outcome]]:
        return queue.nack_many([retry(lease) for lease in chunk])

    outcomes = await _each_lease(service, wanted.leases, nack_chunk, _fenced)
    service.metrics.count_nacked(outcomes)
    if service.tracing is not None:
        retries = [retry(t.lease) for t in wanted.leases]
        service.tracing.lease_nacked(service.topic.name, retries, outcomes)
    return _answer(body, outcomes)


async def _backoff_ms(service: DelayService, leases: list[TokenLease]) -> dict[Lease, int]:
    """The delay of each lease's nack without `delayMs`: what the topic's retry policy
    (`config.backoff`: exponential, jittered as the topic says) gives the message's attempt,
    as the push consumer's nack does: a pull consumer that reports a failure gets the same
    backoff. The attempt is read from each message's record (one read per broker; the nack
    itself stays one script per slot): a lease gone meanwhile reads attempt 0, and its nack
    answers lease_lost whatever the delay."""

    def get_chunk(queue: AsyncQueue, chunk: list[Lease]) -> Awaitable[list[MessageInfo]]:
        return queue.get_many([Target(lease.id, explicit_slot=lease.slot) for lease in chunk])

    infos = await _each_lease(service, leases, get_chunk, lambda _: None)
    backoff = service.config.backoff
    return {
        lease: backoff.delay_ms(info.attempts)
        for (lease, _), info in zip(leases, infos, strict=True)
        if info is not None
    }


async def extend(request: web.Request) -> web.Response:
    service = service_for(request)
    _leaser(service)
    body = await json_body(request)
    leases, ack_timeout_ms = parse_extend(body, service.topic, service.lease_tokens)
    outcomes = await _each_lease(
        service, leases, lambda q, chunk: q.extend_many(chunk, ack_timeout_ms), _fenced
    )
    if service.tracing is not None:
        extended = [t.lease for t in leases]
        service.tracing.lease_extended(service.topic.name, extended, outcomes, ack_timeout_ms)
    return _answer(body, outcomes)
