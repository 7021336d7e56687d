"""Leader election: the pure lease decisions, then the elector against kmock's Lease API."""

from __future__ import annotations

import asyncio
import datetime

import aiohttp
import kmock
import pytest

from delayq.kube.client import KubeClient
from delayq.kube.leader_election import LeaderElector, LeadershipLost, make_identity
from delayq.kube.leader_lease import (
    Action,
    LeaderLeaseRecord,
    LeaderLeaseTiming,
    Observation,
    decide,
    new_leader_lease,
    observe,
    release_patch,
    still_leading,
    write_patch,
)
from delayq.kube.liveness import liveness_server
from delayq.local.ports import free_port

LEASES = "coordination.k8s.io/v1/leases"
LEASE_NS = "delayq-system"
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def record(
    holder: str = "other", duration_s: float = 15, version: str | None = "7"
) -> LeaderLeaseRecord:
    return LeaderLeaseRecord(
        holder, duration_s, transitions=2, renew_time="t", resource_version=version
    )


# --- pure decisions -------------------------------------------------------------------------


def test_no_lease_is_acquired_by_creating_it() -> None:
    assert decide(None, "me", 100.0) is Action.ACQUIRE
    lease = new_leader_lease(LEASE_NS, "delayq-operator", "me", LeaderLeaseTiming(), NOW)
    assert lease["metadata"] == {"name": "delayq-operator", "namespace": LEASE_NS}
    assert lease["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-01-02T03:04:05.678901Z",
        "acquireTime": "2026-01-02T03:04:05.678901Z",
        "leaseTransitions": 0,
    }


def test_the_holder_renews_others_wait_until_the_record_is_stale_for_a_lease_duration() -> None:
    seen = Observation(record(), seen_at_s=100.0)
    assert decide(Observation(record("me"), 100.0), "me", 100.0) is Action.RENEW
    assert decide(seen, "me", 100.0) is Action.WAIT
    assert decide(seen, "me", 114.9) is Action.WAIT
    assert decide(seen, "me", 115.0) is Action.ACQUIRE


def test_a_released_lease_is_acquired_at_once() -> None:
    assert decide(Observation(record(""), 100.0), "me", 100.0) is Action.ACQUIRE


def test_expiry_counts_from_when_the_record_last_changed_not_from_its_renew_time() -> None:
    """Skew-proof: only this candidate's clock matters, and any renewal restarts the count."""
    first = observe(None, record(), 100.0)
    assert observe(first, record(), 110.0) is first  # unchanged: still seen since 100
    renewed = observe(first, record(version="8"), 110.0)  # the holder renewed it
    assert renewed.seen_at_s == 110.0
    assert decide(renewed, "me", 120.0) is Action.WAIT
    assert decide(renewed, "me", 125.0) is Action.ACQUIRE


def test_the_leader_stops_acting_at_the_renew_deadline() -> None:
    timing = LeaderLeaseTiming()
    assert still_leading(100.0, 109.9, timing)
    assert not still_leading(100.0, 110.0, timing)


def test_timing_keeps_the_renew_deadline_inside_the_lease() -> None:
    for bad in (
        {"renew_deadline_s": 15.0},
        {"renew_interval_s": 10.0},
        {"renew_interval_s": 0.0},
    ):
        with pytest.raises(ValueError, match="renew_deadline_s"):
            LeaderLeaseTiming(**bad)


def test_writes_are_fenced_by_the_resource_version_they_were_decided_on() -> None:
    timing = LeaderLeaseTiming(lease_duration_s=2.5, renew_deadline_s=2, renew_interval_s=1)
    acquire = write_patch(Action.ACQUIRE, record(), "me", timing, NOW)
    assert acquire["metadata"] == {"resourceVersion": "7"}
    assert acquire["spec"]["holderIdentity"] == "me"
    assert acquire["spec"]["leaseTransitions"] == 3
    assert acquire["spec"]["leaseDurationSeconds"] == 3  # rounded up, never shorter
    assert "acquireTime" in acquire["spec"]
    renew = write_patch(Action.RENEW, record("me"), "me", timing, NOW)
    assert renew["spec"]["leaseTransitions"] == 2
    assert "acquireTime" not in renew["spec"]
    release = release_patch(record("me"), NOW)
    assert release["spec"]["holderIdentity"] == ""
    assert release["metadata"] == {"resourceVersion": "7"}


def test_identity_is_the_pod_name_and_unique_per_process() -> None:
    first, second = make_identity({"POD_NAME": "op-0"}), make_identity({"POD_NAME": "op-0"})
    assert first.startswith("op-0_")
    assert first != second


# --- the elector against kmock ---------------------------------------------------------------

FAST = LeaderLeaseTiming(
    lease_duration_s=2.0, renew_deadline_s=1.5, renew_interval_s=0.3, retry_interval_s=0.1
)


def holder(api: kmock.KubernetesEmulator) -> str:
    return str(api.objects[LEASES, LEASE_NS, "delayq-operator"]["spec"]["holderIdentity"])


def elector(kube: KubeClient, identity: str) -> LeaderElector:
    return LeaderElector(kube, LEASE_NS, "delayq-operator", identity, FAST)


async def test_first_candidate_creates_the_lease_the_second_waits_until_released(
    api: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    stop = asyncio.Event()
    first, second = elector(kube, "a"), elector(kube, "b")
    assert await first.acquire(stop)
    assert holder(api) == "a"
    waiting = asyncio.create_task(second.acquire(stop))
    holding = asyncio.create_task(first.hold())
    await asyncio.sleep(1.0)  # several renewals of the first: the second keeps waiting
    assert not waiting.done()
    holding.cancel()
    await first.release()
    assert await asyncio.wait_for(waiting, 1.0)  # at once, not after the lease duration
    assert holder(api) == "b"
    assert api.objects[LEASES, LEASE_NS, "delayq-operator"]["spec"]["leaseTransitions"] == 1


async def test_a_dead_holder_is_replaced_after_the_lease_duration(
    api: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    stop = asyncio.Event()
    assert await elector(kube, "dead").acquire(stop)  # and never renews again
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(elector(kube, "b").acquire(stop), 5.0)
    assert loop.time() - started >= FAST.lease_duration_s
    assert holder(api) == "b"


async def test_the_leader_notices_a_takeover_and_gives_up(
    api: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    leader = elector(kube, "a")
    assert await leader.acquire(asyncio.Event())
    holding = asyncio.create_task(leader.hold())
    api.objects[LEASES, LEASE_NS, "delayq-operator"].patch({"spec": {"holderIdentity": "b"}})
    with pytest.raises(LeadershipLost, match="b holds the lease"):
        await asyncio.wait_for(holding, 2.0)
    await leader.release()  # not ours any more: left alone
    assert holder(api) == "b"


async def test_the_leader_gives_up_at_the_renew_deadline_when_the_api_is_gone(
    api: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    leader = elector(kube, "a")
    assert await leader.acquire(asyncio.Event())
    api[kmock.action.UPDATE, kmock.resource("coordination.k8s.io", "v1", "leases")] << 503
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeadershipLost, match=r"within 1\.5 s"):
        await asyncio.wait_for(leader.hold(), 5.0)
    assert loop.time() - started < FAST.lease_duration_s  # before anyone may take over


async def test_every_replica_answers_its_liveness_probe_while_it_runs() -> None:
    """Standbys run no kopf, so the process serves the probe itself (else kubelet kills them)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    async with liveness_server(url), aiohttp.ClientSession() as s, s.get(url) as response:
        assert response.status == 200
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(url):
            pass
