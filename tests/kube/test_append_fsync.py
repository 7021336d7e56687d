"""spec.redis.appendFsync: parsed, rendered into every broker pod, and accepted by redis-server."""

from __future__ import annotations

import re

import pytest
import redis

from delayq.kube.builders.redis import REDIS_START_SCRIPT
from delayq.kube.spec import SpecError
from delayq.local.redis_server import RedisServer
from tests.kube.manifests import by_kind_name, rendered, spec_of
from tests.kube.test_replicated_writes import redis_env

pytestmark = pytest.mark.timeout(60)


def fsync_option(env: dict[str, str]) -> str:
    """The appendfsync value the pod's start script passes to redis-server."""
    (variable,) = re.findall(r"--appendfsync \$([A-Z_]+)", REDIS_START_SCRIPT)
    return env[variable]


def test_default_is_everysec() -> None:
    assert spec_of().redis_append_fsync == "everysec"
    assert fsync_option(redis_env()) == "everysec"


def test_always_reaches_every_broker_pod() -> None:
    manifests = by_kind_name(rendered(spec_of(brokers=2, redis={"appendFsync": "always"})))
    for broker in (0, 1):
        pod = manifests["StatefulSet", f"orders-redis-{broker}"]["spec"]["template"]["spec"]
        env = {item["name"]: item.get("value", "") for item in pod["containers"][0]["env"]}
        assert fsync_option(env) == "always"


@pytest.mark.parametrize("value", ["no", "never", False, 1])
def test_anything_else_is_rejected_naming_the_field(value: object) -> None:
    with pytest.raises(SpecError, match=r"^redis\.appendFsync .* must be everysec or always$"):
        spec_of(redis={"appendFsync": value})


def test_redis_server_runs_with_the_rendered_policy() -> None:
    """The option exactly as rendered: a misspelt one would keep redis-server from starting."""
    env = redis_env(redis={"appendFsync": "always"})
    config = {"appendonly": "yes", "appendfsync": fsync_option(env)}
    with RedisServer(extra_config=config) as server:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()
