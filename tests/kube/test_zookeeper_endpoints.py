"""The platform's ZooKeeper ensembles (kube/ensembles.py): the pure selection, the operator's
settings, a store that connects nowhere else, an ensemble that never answers holding only its
own callers, and the reconcile refusing a topic that names another ensemble (kmock as the API,
the session's real ZooKeeper, a loopback listener playing the ZooKeeper a tenant runs)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kazoo.client import KazooClient

from delayq.coordination.routing import initial_routing
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.ensembles import (
    ALLOWED_ENSEMBLES_ENV,
    MAX_ENSEMBLES,
    EnsembleRefused,
    platform_connect,
)
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.spec import ZK_CONNECT_PATTERN, SpecError, parse_spec
from delayq.kube.tenant_policy import REFUSED_REASON
from delayq.kube.zk import EnsembleNotAllowed, KazooTopicStore, topic_root
from tests.kube.conftest import topic_tree_exists
from tests.kube.listener import SilentListener
from tests.kube.pods import NAMESPACE
from tests.kube.test_events import posted, run
from tests.kube.test_handlers import STS, body, condition, get, put_topic, update_spec

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ("zk-0:2181,zk-1:2181/delayq", "zk.billing.svc:2281")
ADMIN_PASSWORD = "operator-admin-secret"
POLICIES = "networking.k8s.io/v1/networkpolicies"


@pytest.fixture
def silent() -> Iterator[SilentListener]:
    listener = SilentListener()
    try:
        yield listener
    finally:
        listener.close()


# --- the pure selection -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "used"),
    [
        ("", PLATFORM[0]),  # none named: the operator's default
        ("zk-1:2181", PLATFORM[0]),  # some hosts of it: the whole ensemble, its chroot
        ("ZK-1:2181,zk-0:2181", PLATFORM[0]),
        ("zk.billing.svc:2281", PLATFORM[1]),
    ],
)
def test_a_topic_selects_an_allowed_ensemble_by_its_hosts(tenant: str, used: str) -> None:
    assert platform_connect(tenant, PLATFORM) == used


@pytest.mark.parametrize(
    "tenant",
    [
        "zk.tenant.svc:2181",  # a ZooKeeper the tenant runs
        "169.254.169.254:80,zk-0:2181",  # a port to open beside an allowed host
        "zk-0:2181,zk.billing.svc:2281",  # hosts of two ensembles
        "zk-0:2281",  # an allowed host, another port
        "10.0.0.5:2181",  # another spelling of an allowed host is not guessed
    ],
)
def test_any_other_host_is_refused_naming_the_rule(tenant: str) -> None:
    with pytest.raises(EnsembleRefused) as refused:
        platform_connect(tenant, PLATFORM)
    message = str(refused.value)
    assert message.startswith(f"spec.zookeeper.connect {tenant!r} names a host of no ZooKeeper")
    assert "zookeeper.allowedEnsembles: zk-0:2181,zk-1:2181; zk.billing.svc:2281" in message


def test_a_chroot_is_refused_by_the_parser_and_the_crd() -> None:
    """Issue 27, attack 2: a path would put the operator's writes (as admin) into another
    tenant's tree, e.g. a phantom member under its `members`."""
    victim = "zk-0:2181/delayq/billing/invoices/members"
    with pytest.raises(SpecError, match=r"zookeeper\.connect .* \(no /path"):
        parse_spec("orders", "shop", {"zookeeper": {"connect": victim}})
    assert parse_spec("orders", "shop", {"zookeeper": {"connect": "zk-0:2181"}})
    crd = yaml.safe_load((ROOT / "crds" / "delaytopics.delayq.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    connect = spec["properties"]["zookeeper"]["properties"]["connect"]
    assert connect["pattern"] == ZK_CONNECT_PATTERN.pattern


# --- the operator's settings ------------------------------------------------------------------


def test_the_allowed_ensembles_come_from_the_operators_environment() -> None:
    assert OperatorConfig.from_env({}).build.zookeeper_ensembles == (
        "zookeeper.delayq-system.svc:2181",  # the default ensemble only
    )
    env = {"DELAYQ_ZOOKEEPER": PLATFORM[0], ALLOWED_ENSEMBLES_ENV: f'["{PLATFORM[1]}"]'}
    assert OperatorConfig.from_env(env).build.zookeeper_ensembles == PLATFORM


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        ('"zk:2181"', "must be a JSON list of connection strings"),
        ('["zk-1:2181/other"]', "share host zk-1:2181"),  # one host, two chroots
        ('["zk:2181 /x"]', "must look like host"),
        (str([f"zk-{n}:2181" for n in range(MAX_ENSEMBLES)]).replace("'", '"'), "at most 16"),
    ],
)
def test_bad_allowed_ensembles_stop_the_operator_with_one_line(allowed: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorConfig.from_env({"DELAYQ_ZOOKEEPER": PLATFORM[0], ALLOWED_ENSEMBLES_ENV: allowed})


def test_tls_to_zookeeper_needs_the_platforms_ca_or_an_explicit_no() -> None:
    """Issue 27, attack 7: with the system CAs any public certificate passed for any host."""
    with pytest.raises(ValueError, match=r"DELAYQ_ZOOKEEPER_TLS_CA_FILE must name the ensembles"):
        OperatorConfig.from_env({"DELAYQ_ZOOKEEPER_TLS": "true"})
    unverified = {"DELAYQ_ZOOKEEPER_TLS": "true", "DELAYQ_ZOOKEEPER_TLS_VERIFY_CERTS": "false"}
    tls = OperatorConfig.from_env(unverified).zookeeper_tls
    assert tls is not None
    assert not tls.verify_certs


# --- the store --------------------------------------------------------------------------------


async def test_the_admin_digest_never_reaches_a_host_the_platform_did_not_allow(
    silent: SilentListener, zk_connect: str
) -> None:
    """Issue 27, attack 1, at the last gate: whatever a caller passes, the store logged in as
    the operator opens no connection to anything but the platform's ensembles."""
    store = KazooTopicStore([zk_connect], timeout_s=2.0, admin_password=ADMIN_PASSWORD)
    routing = initial_routing(4, 1)
    try:
        for connect in (silent.connect, f"{zk_connect}/delayq/shop/victim/members"):
            calls = (
                store.read_routing(connect, "shop", "orders"),
                store.publish(connect, "shop", "orders", routing, "pw", uid="uid-1"),
                store.owned_slots(connect, "shop", "orders"),
                store.tree_uid(connect, "shop", "orders"),
                store.delete(connect, "shop", "orders"),
                store.topic_trees(connect, []),
            )
            for call in calls:
                with pytest.raises(EnsembleNotAllowed):
                    await call
            with pytest.raises(EnsembleNotAllowed):
                store.slot_mover(connect, "shop", "orders", [])
    finally:
        await asyncio.to_thread(store.close)
    assert silent.connections == 0
    assert ADMIN_PASSWORD.encode() not in silent.received
    with pytest.raises(ValueError, match="at most 16"):
        KazooTopicStore([f"zk-{n}:2181" for n in range(MAX_ENSEMBLES + 1)])


@pytest.fixture
async def two_ensembles(
    zk_connect: str, silent: SilentListener
) -> AsyncIterator[KazooTopicStore]:
    store = KazooTopicStore([zk_connect, silent.connect], timeout_s=2.0)
    yield store
    await asyncio.to_thread(store.close)


async def test_an_ensemble_that_never_answers_holds_only_its_own_callers(
    two_ensembles: KazooTopicStore, silent: SilentListener, zk_connect: str
) -> None:
    """Issue 27, attack 4: topics on a host that accepts and never answers made another
    topic's routing read wait for their connecting (one lock around every start, one shared
    pool of threads) until it timed out."""
    stalled = [
        asyncio.create_task(two_ensembles.read_routing(silent.connect, "shop", f"t{n}"))
        for n in range(8)
    ]
    deadline = time.monotonic() + 2.0
    while silent.connections == 0:  # a start is under way, holding its ensemble's lock
        assert time.monotonic() < deadline, "the stalled ensemble was never dialled"
        await asyncio.sleep(0.01)
    started = time.monotonic()
    assert await two_ensembles.read_routing(zk_connect, "shop", "unpublished") is None
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 1.0, f"the healthy ensemble's read waited {elapsed_s:.2f} s"
    outcomes = await asyncio.gather(*stalled, return_exceptions=True)
    assert all(isinstance(outcome, TimeoutError) for outcome in outcomes), outcomes


# --- the reconcile ----------------------------------------------------------------------------


def children(api: kmock.KubernetesEmulator) -> list[Any]:
    return [
        get(api, resource, name)
        for resource, name in (
            ("v1/secrets", "orders-credentials"),
            ("v1/configmaps", "orders-config"),
            (STS, "orders-service"),
            (POLICIES, "orders-service"),
        )
    ]


async def test_a_new_topic_naming_another_ensemble_gets_nothing_and_no_connection(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    silent: SilentListener,
    logger: logging.Logger,
) -> None:
    """Issue 27, attack 1 through the operator (logged in as admin): Provisioned and Ready
    False with the tenant policy's reason, a Warning Event, no child, no tree, and the
    tenant's listener never dialled."""
    admin = KazooTopicStore(ctx.build.zookeeper_ensembles, admin_password=ADMIN_PASSWORD)
    ctx.store = admin
    try:
        put_topic(api, zookeeper={"connect": silent.connect})
        await run(ctx, api, logger, reconcile)
    finally:
        await asyncio.to_thread(admin.close)
    for kind in ("Provisioned", "Ready"):
        refused = condition(api, kind)
        assert (refused["status"], refused["reason"]) == ("False", REFUSED_REASON)
        assert refused["message"].startswith(f"spec.zookeeper.connect '{silent.connect}'")
        assert refused["message"].endswith("running pods keep their settings.")
    assert posted(api) == [("Warning", REFUSED_REASON)]
    assert children(api) == [None] * 4
    assert not topic_tree_exists(zk)
    assert silent.connections == 0


async def test_a_running_topic_switched_to_another_ensemble_keeps_its_pods_and_is_left_alone(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    zk_connect: str,
    silent: SilentListener,
    logger: logging.Logger,
) -> None:
    """Attacks 2 and 6 on a running topic: a metadata-endpoint port beside the real host and
    a chroot into a victim's tree are refused with nothing rolled out; the health pass does
    not touch a refused ensemble; corrected, the topic is provisioned on the platform's."""
    put_topic(api, zookeeper={"connect": zk_connect})
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Provisioned")["reason"] == "ResourcesApplied"
    assert zk.get(topic_root(NAMESPACE, "orders"))[0] == b"uid-orders"  # the GC's marker
    before = children(api)
    zk_port = int(zk_connect.rsplit(":", 1)[1])
    assert before[3]["spec"]["egress"][2] == {"ports": [{"protocol": "TCP", "port": zk_port}]}

    update_spec(api, zookeeper={"connect": f"169.254.169.254:80,{zk_connect}"})
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Ready")["reason"] == REFUSED_REASON
    assert children(api) == before

    update_spec(api, zookeeper={"connect": f"{zk_connect}/delayq/shop/victim/members"})
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Ready")["reason"] == "InvalidSpec"
    assert children(api) == before

    update_spec(api, zookeeper={"connect": silent.connect})
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Ready")["reason"] == REFUSED_REASON
    assert await refresh(ctx, body(api), logger) == {}  # no pass on a refused ensemble
    assert children(api) == before
    assert silent.connections == 0

    update_spec(api, zookeeper={"connect": zk_connect})
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Provisioned")["reason"] == "ResourcesApplied"
