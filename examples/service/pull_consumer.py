"""A pull consumer over the HTTP API: lease (long poll), handle, ack on the next lease — or nack
to retry later.

    delayq serve --topic orders --api-token t0ken --port 8080 &
    DELAYQ_URL=http://127.0.0.1:8080 DELAYQ_TOKEN=t0ken python3 examples/service/pull_consumer.py

One request per batch: each lease carries the tokens of the messages handled since the last one
in `ack`, and its answer reports each (`acks`: `acked`, or `lease_lost` / `stale_epoch` when the
lease ran out or a failover fenced it: that message comes back, handle it idempotently). The
lease waits up to `waitMs` for something to be due and answers as soon as something is.
A lease lasts `ackTimeoutMs`; extend it for long work. On exit, the last tokens go to `.../ack`.
A lease request that fails (an error status, a reset connection, a timeout) may or may not have
acked what it carried: the same tokens go on the next request, after a pause (an ack already
applied answers `lease_lost`, changing nothing).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp

URL = os.environ.get("DELAYQ_URL", "http://127.0.0.1:8080")
TOPIC = os.environ.get("DELAYQ_TOPIC", "orders")
HEADERS = {"Authorization": f"Bearer {os.environ.get('DELAYQ_TOKEN', '')}"}
RETRY_S = 1.0  # after a failed request; a 429 or 503 says how long in Retry-After
RETRIED = frozenset({408, 429, 500, 502, 503, 504})  # any other error is this program's bug


async def handle(message: dict[str, object]) -> bool:
    print(f"{message['id']} (attempt {message['attempt']}): {message['payload']}")
    return True


async def check_acks(
    session: aiohttp.ClientSession, leases_url: str, sent: list[str], answer: dict[str, Any]
) -> None:
    """Report the lease answer's `acks` for the tokens `sent` in its `ack`. A serve process
    from before acks on leases (one not yet upgraded in a rolling upgrade) ignores `ack` and
    answers without `acks`: those tokens are then acked with a request of their own, else
    their messages would all come again once their leases ran out."""
    results = answer.get("acks")
    if results is None and sent:
        async with session.post(f"{leases_url}/ack", json={"tokens": sent}) as response:
            results = (await response.json())["results"]
    for result in results or []:
        if result["result"] != "acked":
            # acked by an earlier request whose answer was lost, or it comes again
            print(f"{result['id']}: not acked by this request ({result['result']})")


async def lease(
    session: aiohttp.ClientSession, leases_url: str, done: list[str]
) -> list[dict[str, Any]] | None:
    """The next batch, acking the tokens `done` on the way; None when the request failed,
    after a pause: its acks may not have been applied, so the caller keeps `done` and sends it
    again with the next request."""
    body = {"max": 100, "ackTimeoutMs": 30_000, "waitMs": 10_000, "ack": done}
    answer: dict[str, Any] | None = None
    try:
        async with session.post(leases_url, json=body) as response:
            if response.status == 200:
                answer = await response.json()
            elif response.status not in RETRIED:
                raise RuntimeError(f"lease refused ({response.status}): {await response.text()}")
            else:
                pause_s = float(response.headers.get("Retry-After", RETRY_S))
                print(f"lease failed ({response.status}): {await response.text()}")
    except (aiohttp.ClientError, TimeoutError) as error:
        pause_s = RETRY_S
        print(f"lease failed ({error!r})")
    if answer is None:
        await asyncio.sleep(pause_s)
        return None
    await check_acks(session, leases_url, done, answer)  # the leases are ours whatever it says
    leases: list[dict[str, Any]] = answer["leases"]
    return leases


async def main() -> None:
    leases_url = f"{URL}/v1/topics/{TOPIC}/leases"
    done: list[str] = []
    async with aiohttp.ClientSession(headers=HEADERS) as session:
        try:
            while True:
                leases = await lease(session, leases_url, done)
                if leases is None:
                    continue  # `done` goes again with the next request
                done, failed = [], []
                for message in leases:
                    (done if await handle(message) else failed).append(message["token"])
                if failed:
                    retry = {"tokens": failed}  # later, by the topic's retry policy
                    async with session.post(f"{leases_url}/nack", json=retry) as response:
                        await response.read()
        finally:
            if done:  # handled, not acked yet: ack them rather than let their leases expire
                async with session.post(f"{leases_url}/ack", json={"tokens": done}) as response:
                    await response.read()


if __name__ == "__main__":
    asyncio.run(main())
