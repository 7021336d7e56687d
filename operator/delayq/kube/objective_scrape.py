"""Read the delay-service pods' lateness histograms from their /metrics, for objectives.py.

The operator reads a topic's pods only when the topic has an objective, all of them at once
under one deadline (`SCRAPE_TIMEOUT_S`), after the pass's failover decisions: a slow or silent
pod costs the pass at most that long and is reported as silent, never as late. /metrics needs
the topic's metrics token, which the operator's copy of the credentials holds; the answer is
read up to `MAX_METRICS_BYTES` and parsed with prometheus_client's own text parser.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from delayq.kube import naming
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.objectives import Buckets, Silence

LATENESS_FAMILY = "delayq_delivery_lateness_seconds"
SCRAPE_TIMEOUT_S = 2.0
# A pod's /metrics is a few hundred series, tens of KiB; more is not a delay service's answer.
MAX_METRICS_BYTES = 4 * 1024 * 1024
#: A bucket's count at most (a 64-bit counter): the answer is the pod's, which its tenant may
#: write; +Inf, or counts whose sum over pods leaves a float's range, broke the pass.
MAX_BUCKET_COUNT = 2**63
#: Buckets of one topic's histogram at most (the service has 16 with +Inf): each pod's reading
#: is kept for the objective's window (up to an hour of passes), so a pod telling thousands of
#: `le` bounds must not make the operator keep them.
MAX_BUCKETS = 64


class MetricsScraper:
    """Reads `http://<pod IP>:<port>/metrics` of the service pods.

    `addresses` is TEST-ONLY and never set by the operator (as RedisCommands' addresses): it
    maps a pod IP to the (host, port) of a local server playing that pod.
    """

    def __init__(
        self,
        port: int = naming.SERVICE_HTTP_PORT,
        addresses: Mapping[str, tuple[str, int]] | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self.port = port
        self.addresses: Mapping[str, tuple[str, int]] = {} if addresses is None else addresses
        self.timeout_s = timeout_s

    async def lateness(
        self, pods: Mapping[str, str], token: str, topic: tuple[str, str]
    ) -> dict[str, Buckets | Silence]:
        """Each pod's (key -> pod IP) lateness buckets of `topic` (namespace, name), empty for
        a pod that delivered nothing yet; why not for a pod that refused the token (401, 403),
        did not answer in time or not in the exposition format."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            read = [self._read(session, address, topic) for address in pods.values()]
            found = await asyncio.gather(*read)
        return dict(zip(pods, found, strict=True))

    async def _read(
        self, session: aiohttp.ClientSession, address: str, topic: tuple[str, str]
    ) -> Buckets | Silence:
        host, port = self.addresses.get(address) or (address, self.port)
        try:
            async with session.get(f"http://{host}:{port}/metrics") as answer:
                if answer.status in (401, 403):
                    return Silence.REFUSED
                if answer.status != 200:
                    return Silence.UNANSWERED
                body = bytearray()
                async for chunk in answer.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        return Silence.UNANSWERED
        except TRANSIENT_ERRORS:
            return Silence.UNANSWERED
        found = lateness_buckets(body.decode("utf-8", "replace"), topic)
        return Silence.UNANSWERED if found is None else found


def lateness_buckets(text: str, topic: tuple[str, str]) -> Buckets | None:
    """The topic's cumulative lateness buckets in a /metrics answer (empty: none yet); None if
    it is not the exposition format."""
    labels = {"topic_namespace": topic[0], "topic": topic[1]}
    counts: dict[float, int] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name != LATENESS_FAMILY:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket") and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    bound, count = float(sample.labels["le"]), sample.value
                    if math.isnan(bound) or not 0 <= count <= MAX_BUCKET_COUNT:
                        return None  # no process counts so (inf, NaN, < 0): not a histogram
                    counts[bound] = counts.get(bound, 0) + int(count)
                    if len(counts) > MAX_BUCKETS:
                        return None
    except (ValueError, KeyError, TypeError):
        return None
    return tuple(sorted(counts.items()))
