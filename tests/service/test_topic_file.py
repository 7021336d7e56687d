"""`delayq serve --config`: the operator's topic.json (built by the operator's own builder from
the example DelayTopics) becomes a valid ServiceConfig, secrets and identity from the pod env."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from delayq.kube.builders.common import BuildContext
from delayq.kube.builders.service import config_map, topic_file
from delayq.kube.naming import CONFIG_KEY
from delayq.kube.spec import parse_spec
from delayq.queue.settings import SETTINGS
from delayq.queue.topic import TopicType
from delayq.service.config import ConfigError, ServiceConfig
from delayq.service.topic_file import SERVE_SETTINGS, TopicFile, read_topic_file

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "valid").glob("*.yaml"))
POD_ENV = {"POD_NAME": "orders-service-2", "DELAYQ_REDIS_PASSWORD": "p@ss/word"}
#: The operator's context, allowing the ensemble an example names (kube/ensembles.py)
CONTEXT = BuildContext(zookeeper_allowed_ensembles=("zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181",))


def operator_file(path: Path) -> TopicFile:
    manifest = yaml.safe_load(path.read_text())
    metadata = manifest["metadata"]
    spec = parse_spec(metadata["name"], metadata.get("namespace", "default"), manifest["spec"])
    return topic_file(spec, CONTEXT, spec.slot_amount)


def service_config(file: TopicFile) -> ServiceConfig:
    return ServiceConfig.from_env({}, file.service_settings(POD_ENV))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_topic_makes_a_valid_service_config(example: Path):
    file = operator_file(example)
    config = service_config(TopicFile.from_json(file.to_json()))
    assert config.topic == file.topic
    assert config.slot_amount == file.setting("slot_amount")
    assert config.topic_type is file.setting("topic_type")
    assert len(config.broker_redis_urls) == file.brokers
    assert config.member == "orders-service-2"
    assert config.host == "0.0.0.0"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_the_config_map_the_operator_writes_parses_back_to_the_same_file(example: Path):
    manifest = yaml.safe_load(example.read_text())
    metadata = manifest["metadata"]
    spec = parse_spec(metadata["name"], metadata.get("namespace", "default"), manifest["spec"])
    text = config_map(spec, CONTEXT, spec.slot_amount)["data"][CONFIG_KEY]
    parsed = TopicFile.from_json(text)
    assert parsed == topic_file(spec, CONTEXT, spec.slot_amount)
    assert parsed.to_json() == text


def test_the_json_keys_are_the_field_names_and_the_serve_settings():
    file = operator_file(EXAMPLES[0])
    document = json.loads(file.to_json())
    fields = {f.name for f in dataclasses.fields(TopicFile)} - {"settings"}
    assert list(document) == sorted(fields | set(SERVE_SETTINGS))
    assert document["topic_type"] == file.setting("topic_type").value
    settings = {f.name for f in dataclasses.fields(ServiceConfig)}
    assert set(file.service_settings(POD_ENV)) <= settings
    # one name per setting: every field is the serve setting of that name, except where the
    # brokers and the HTTP port are
    not_settings = {"brokers", "redis_master_host_template", "redis_port", "http_port"}
    assert fields - settings == not_settings
    # the settings are the table's that serve takes, each a ServiceConfig field
    assert set(SERVE_SETTINGS) == {row.name for row in SETTINGS if row.serve} <= settings


def test_broker_urls_carry_the_escaped_password_and_the_template():
    config = service_config(operator_file(next(p for p in EXAMPLES if "webhook" in p.stem)))
    assert (
        config.broker_redis_urls[1]
        == "redis://delayq-service:p%40ss%2Fword@callbacks-redis-1.default.svc:6379/0"
    )
    assert config.redis_url == config.broker_redis_urls[0]
    assert config.zookeeper_connect.startswith("zk-0.zk:2181")
    assert config.worker_concurrency == 32  # worker.concurrency


def test_environment_and_flags_still_override_the_file(tmp_path: Path):
    path = tmp_path / "topic.json"
    path.write_text(operator_file(EXAMPLES[0]).to_json())
    base = read_topic_file(path, {})
    config = ServiceConfig.from_env({"DELAYQ_API_TOKEN": "t", "DELAYQ_PORT": "9999"}, base)
    assert (config.api_token, config.port) == ("t", 9999)


def test_a_broken_file_is_one_line_naming_the_key(tmp_path: Path):
    document = json.loads(operator_file(EXAMPLES[0]).to_json())
    cases = {
        "missing key 'topic'": {k: v for k, v in document.items() if k != "topic"},
        "unknown key 'zookeeper'": {**document, "zookeeper": {"root": "/delayq"}},
        "key 'slot_amount' must be an integer": {**document, "slot_amount": "16"},
        "key 'brokers' must be an integer": {**document, "brokers": True},
        "key 'webhook_url' must be a string": {**document, "webhook_url": None},
        "key 'topic_type' must be one of pull, webhook, stream": {**document, "topic_type": "x"},
    }
    for expected, broken in cases.items():
        with pytest.raises(ConfigError, match=expected) as raised:
            TopicFile.from_json(json.dumps(broken))
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="must be a JSON object"):
        TopicFile.from_json("[]")
    with pytest.raises(ConfigError, match="not JSON"):
        TopicFile.from_json("{")
    with pytest.raises(ConfigError, match="--config"):
        read_topic_file(tmp_path / "absent.json", {})
    path = tmp_path / "topic.json"
    path.write_text(json.dumps({**document, "extra": 1}))
    with pytest.raises(ConfigError, match=f"--config {path}: topic file: unknown key 'extra'"):
        read_topic_file(path, {})


def test_a_pull_file_round_trips_its_topic_type():
    file = operator_file(EXAMPLES[0])
    file = dataclasses.replace(file, settings={**file.settings, "topic_type": TopicType.STREAM})
    assert TopicFile.from_json(file.to_json()) == file
