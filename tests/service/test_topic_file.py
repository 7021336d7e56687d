"""`delayq serve --config`: the operator's topic.json (built by the operator's own builder from
the example DelayTopics) becomes a valid ServiceConfig, secrets and identity from the pod env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from delayq.kube.builders.common import BuildContext
from delayq.kube.builders.service import topic_config
from delayq.kube.spec import parse_spec
from delayq.service.config import ConfigError, ServiceConfig
from delayq.service.topic_file import read_topic_file, settings_from_topic

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "valid").glob("*.yaml"))
POD_ENV = {"POD_NAME": "orders-service-2", "DELAYQ_REDIS_PASSWORD": "p@ss/word"}


def operator_document(path: Path) -> dict[str, object]:
    manifest = yaml.safe_load(path.read_text())
    metadata = manifest["metadata"]
    spec = parse_spec(metadata["name"], metadata.get("namespace", "default"), manifest["spec"])
    return topic_config(spec, BuildContext(), spec.slot_amount)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_topic_makes_a_valid_service_config(example: Path):
    document = operator_document(example)
    config = ServiceConfig.from_env({}, settings_from_topic(document, POD_ENV))
    assert config.topic == document["topic"]
    assert config.slot_amount == document["slotAmount"]
    assert config.topic_type.value == document["topicType"]
    assert len(config.brokers) == document["brokers"]
    assert config.member == "orders-service-2"
    assert config.host == "0.0.0.0"


def test_broker_urls_carry_the_escaped_password_and_the_template():
    document = operator_document(next(p for p in EXAMPLES if "webhook" in p.stem))
    config = ServiceConfig.from_env({}, settings_from_topic(document, POD_ENV))
    assert config.brokers[1] == "redis://:p%40ss%2Fword@callbacks-redis-1.default.svc:6379/0"
    assert config.redis_url == config.brokers[0]
    assert config.zookeeper.startswith("zk-0.zk:2181")
    assert config.max_in_flight == 32  # worker.concurrency


def test_environment_and_flags_still_override_the_file(tmp_path: Path):
    document = operator_document(EXAMPLES[0])
    path = tmp_path / "topic.json"
    path.write_text(json.dumps(document))
    base = read_topic_file(path, {})
    config = ServiceConfig.from_env({"DELAYQ_API_TOKEN": "t", "DELAYQ_PORT": "9999"}, base)
    assert (config.api_token, config.port) == ("t", 9999)


def test_a_broken_file_names_what_is_missing(tmp_path: Path):
    with pytest.raises(ConfigError, match="topic"):
        settings_from_topic({"namespace": "x"}, {})
    with pytest.raises(ConfigError, match="--config"):
        read_topic_file(tmp_path / "absent.json", {})
