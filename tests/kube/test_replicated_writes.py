"""spec.redis.minReplicasToWrite: parsed, bounded, rendered, and refused by a real Redis.

The last test starts redis-server with exactly the options the pod script would pass, so a
misspelt option (redis-server refuses to start) or a write that slips through fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from delayq.kube.builders.common import BuildContext
from delayq.kube.builders.redis import REDIS_START_SCRIPT
from delayq.kube.builders.service import topic_file
from delayq.kube.spec import SpecError
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import functions
from delayq.queue.client import Queue
from delayq.queue.model import State
from delayq.queue.settings import RULES
from delayq.service.config import ServiceConfig
from delayq.service.topic_file import TopicFile
from tests.kube.manifests import by_kind_name, rendered, spec_of

#: The messages of the rules between replica counts (the table's RULES, by offending setting).
MIN_REPLICAS_EXCEED_MESSAGE = next(
    r.message for r in RULES if r.names[0] == "redis_min_replicas_to_write"
)
SYNC_REPLICAS_EXCEED_MESSAGE = next(r.message for r in RULES if r.names[0] == "redis_sync_replicas")

pytestmark = pytest.mark.timeout(60)


def redis_env(**spec: Any) -> dict[str, str]:
    sts = by_kind_name(rendered(spec_of(**spec)))["StatefulSet", "orders-redis-0"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", "") for item in container["env"]}


def min_replicas_options(env: dict[str, str]) -> dict[str, str]:
    """redis-server options the start script builds from the container's environment."""
    pairs = re.findall(r"--(min-replicas-[a-z-]+) \$([A-Z_]+)", REDIS_START_SCRIPT)
    assert len(pairs) == 2, REDIS_START_SCRIPT
    return {option: env[variable] for option, variable in pairs}


def test_default_keeps_asynchronous_replication() -> None:
    spec = spec_of()
    assert (spec.redis_min_replicas_to_write, spec.redis_min_replicas_max_lag_seconds) == (0, 10)
    assert min_replicas_options(redis_env()) == {
        "min-replicas-to-write": "0",
        "min-replicas-max-lag": "10",
    }


def test_settings_reach_every_broker_pod() -> None:
    redis_spec = {"minReplicasToWrite": 2, "minReplicasMaxLagSeconds": 5}
    manifests = by_kind_name(rendered(spec_of(brokers=2, replicasPerBroker=2, redis=redis_spec)))
    for broker in (0, 1):
        pod = manifests["StatefulSet", f"orders-redis-{broker}"]["spec"]["template"]["spec"]
        env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
        assert (env["MIN_REPLICAS_TO_WRITE"], env["MIN_REPLICAS_MAX_LAG_S"]) == ("2", "5")


@pytest.mark.parametrize(("replicas", "minimum"), [(0, 1), (1, 2), (2, 5)])
def test_more_than_the_broker_has_is_rejected(replicas: int, minimum: int) -> None:
    with pytest.raises(SpecError) as error:
        spec_of(replicasPerBroker=replicas, redis={"minReplicasToWrite": minimum})
    assert MIN_REPLICAS_EXCEED_MESSAGE in str(error.value)
    assert f"minReplicasToWrite={minimum}, replicasPerBroker={replicas}" in str(error.value)


@pytest.mark.parametrize(
    ("redis_spec", "field"),
    [
        ({"minReplicasToWrite": -1}, "redis.minReplicasToWrite"),
        ({"minReplicasToWrite": "1"}, "redis.minReplicasToWrite"),
        ({"minReplicasMaxLagSeconds": 0}, "redis.minReplicasMaxLagSeconds"),
        ({"minReplicasMaxLagSeconds": 3601}, "redis.minReplicasMaxLagSeconds"),
    ],
)
def test_out_of_bounds_values_name_the_field(redis_spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{re.escape(field)} must be an integer between"):
        spec_of(replicasPerBroker=5, redis=redis_spec)


def test_equal_to_the_replicas_is_accepted() -> None:
    spec = spec_of(replicasPerBroker=2, redis={"minReplicasToWrite": 2})
    assert spec.redis_min_replicas_to_write == 2


@pytest.fixture
def master() -> Iterator[RedisServer]:
    """A master started with the options a pod with minReplicasToWrite=1 gets."""
    env = redis_env(replicasPerBroker=1, redis={"minReplicasToWrite": 1})
    with RedisServer(extra_config=min_replicas_options(env)) as server:
        yield server


def good_replicas(server: RedisServer) -> int:
    info = redis.Redis.from_url(server.url).info("replication")
    return int(info.get("min_slaves_good_slaves", 0))


def test_writes_are_refused_with_noreplicas_until_a_replica_is_in_sync(
    master: RedisServer,
) -> None:
    """Producers get an error (the API answers 503 for any Redis error) instead of a write that
    a failover could lose; once a replica acknowledges replication, writes pass again."""
    queue = Queue.from_url(master.url, spec_of().topic)
    # FUNCTION LOAD is a write too, refused the same way: the operator loads the library on
    # the first pass after the master takes writes; here with the option off for a moment
    queue.redis.config_set("min-replicas-to-write", 0)
    functions.load(queue.redis)
    queue.redis.config_set("min-replicas-to-write", 1)
    try:
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            queue.schedule("m-1", b"payload", delay_ms=1000)
        assert queue.get("m-1").state is State.ABSENT
        with RedisServer(extra_config={"replicaof": f"127.0.0.1 {master.port}"}):
            wait_until(lambda: good_replicas(master) == 1, 20, "the replica in sync")
            queue.schedule("m-1", b"payload", delay_ms=1000)
            assert queue.get("m-1").state is State.SCHEDULED
    finally:
        queue.close()


def test_sync_replicas_reach_the_engine_topic_of_every_service_pod() -> None:
    """spec.redis.syncReplicas / syncTimeout → TopicSpec → topic.json → ServiceConfig → Topic:
    the engine's WAIT is what the tenant asked for (tests/queue/test_sync_replication.py proves
    the WAIT itself on a real master and replica)."""
    spec = spec_of(replicasPerBroker=2, redis={"syncReplicas": 2, "syncTimeout": "250ms"})
    assert (spec.redis_sync_replicas, spec.redis_sync_timeout_ms) == (2, 250)
    file = TopicFile.from_json(topic_file(spec, BuildContext(), spec.slot_amount).to_json())
    config = ServiceConfig.from_env({}, file.service_settings({}))
    topic = config.to_topic()
    assert (topic.redis_sync_replicas, topic.redis_sync_timeout_ms) == (2, 250)
    assert spec_of().topic.redis_sync_replicas == 0  # asynchronous unless asked


@pytest.mark.parametrize(("replicas", "wanted"), [(0, 1), (1, 2)])
def test_more_sync_replicas_than_the_broker_has_is_rejected(replicas: int, wanted: int) -> None:
    with pytest.raises(SpecError) as error:
        spec_of(replicasPerBroker=replicas, redis={"syncReplicas": wanted})
    assert SYNC_REPLICAS_EXCEED_MESSAGE in str(error.value)
    assert f"syncReplicas={wanted}, replicasPerBroker={replicas}" in str(error.value)


@pytest.mark.parametrize("timeout", ["5ms", "61s", "soon"])
def test_sync_timeout_out_of_bounds_names_the_field(timeout: str) -> None:
    with pytest.raises(SpecError, match=r"redis\.syncTimeout"):
        spec_of(replicasPerBroker=1, redis={"syncReplicas": 1, "syncTimeout": timeout})
