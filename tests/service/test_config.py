"""ServiceConfig: environment, flags and their precedence; errors that name the setting."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from delayq.local.processes import config_env
from delayq.queue.settings import SETTINGS, by_name
from delayq.queue.topic import ROUTING_FIELDS, EndAction, Topic, TopicType
from delayq.service.config import ConfigError, ServiceConfig, add_arguments, check_exposure

DEFAULTS = {row.name: row.default for row in SETTINGS}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_a_pull_topic_on_local_redis():
    config = ServiceConfig.from_env({})
    assert config.topic_type is TopicType.PULL
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert config.to_topic().slot_amount == 16


def test_topic_settings_default_from_the_table():
    """The settings a DelayTopic sets are named as in the table, with its defaults."""
    config = ServiceConfig()
    shared = {f.name for f in dataclasses.fields(ServiceConfig)} & set(DEFAULTS)
    # the table's rows serve takes (tests/test_settings.py holds them to the table's consumers)
    assert shared == {row.name for row in SETTINGS if row.serve}
    # the deliberate differences (docs/service.md): run by hand, serve may reach this machine,
    # over plain http; the operator always writes the topic's values, which default to false
    hand_run = {
        "webhook_allow_private_targets",
        "webhook_allow_insecure_http",
        "stream_allow_private_targets",
    }
    for name in hand_run:
        assert getattr(config, name) is True
        assert DEFAULTS[name] is False
        assert by_name(name).serve_default is True
    for name in shared - hand_run:
        assert getattr(config, name) == DEFAULTS[name], name
    assert config.webhook_timeout_ms == 10_000
    assert config.pull_max_lease_batch == 1000
    # a webhook topic with every default is valid: the lease outlives the POST it covers
    webhook = ServiceConfig(topic_type=TopicType.WEBHOOK, webhook_url="http://127.0.0.1/h")
    assert webhook.webhook_timeout_ms < webhook.ack_timeout_ms


def test_environment_is_typed():
    config = ServiceConfig.from_env(
        {
            "DELAYQ_TOPIC": "orders",
            "DELAYQ_SLOT_AMOUNT": "64",
            "DELAYQ_TOPIC_TYPE": "webhook",
            "DELAYQ_WEBHOOK_URL": "http://receiver/hook",
            "UNRELATED": "x",
        }
    )
    assert (config.topic, config.slot_amount, config.topic_type) == (
        "orders",
        64,
        TopicType.WEBHOOK,
    )


def test_flags_override_the_environment():
    base = ServiceConfig.from_env({"DELAYQ_TOPIC": "orders", "DELAYQ_PORT": "9000"})
    config = ServiceConfig.from_args(parse(["--port", "9100", "--max-retries", "3"]), base)
    assert (config.topic, config.port, config.max_retries) == ("orders", 9100, 3)


def test_unset_flags_keep_the_base():
    base = ServiceConfig(topic="kept", slot_amount=8)
    assert ServiceConfig.from_args(parse([]), base) == base


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DELAYQ_SLOT_AMOUNT": "ten"}, "DELAYQ_SLOT_AMOUNT"),
        ({"DELAYQ_SLOT_AMOUNT": "12"}, "slotAmount"),
        ({"DELAYQ_TOPIC_TYPE": "webhook"}, "DELAYQ_WEBHOOK_URL"),
        ({"DELAYQ_BATCH_SIZE": "0"}, "DELAYQ_BATCH_SIZE"),
        (
            {
                "DELAYQ_TOPIC_TYPE": "webhook",
                "DELAYQ_WEBHOOK_URL": "http://r/h",
                "DELAYQ_WEBHOOK_TIMEOUT_MS": "30000",
            },
            r"DELAYQ_WEBHOOK_TIMEOUT_MS\): .* shorter than ackTimeout",
        ),
        ({"DELAYQ_TOPIC": "Not_A_Label"}, "topic name"),
        ({"DELAYQ_API_TOKEN_PREVIOUS": "old"}, "needs --api-token"),
        ({"DELAYQ_INSECURE_NO_AUTH": "maybe"}, "DELAYQ_INSECURE_NO_AUTH"),
        ({"DELAYQ_WEBHOOK_SECRET": "s3cret"}, r"DELAYQ_WEBHOOK_SECRET\): .* whsec_"),
        ({"DELAYQ_WEBHOOK_EXTRA_HEADERS": "Host: x"}, "DELAYQ_WEBHOOK_EXTRA_HEADERS.*line 1"),
        (
            {"DELAYQ_RATE_LIMIT_PER_SECOND": "1e-15"},
            r"DELAYQ_RATE_LIMIT_PER_SECOND\): .* or at least 0\.001",
        ),
        (
            {"DELAYQ_TOPIC_TYPE": "stream", "DELAYQ_STREAM_KEY": "dq-settings:{default/t/0}"},
            r"^--stream-key \(DELAYQ_STREAM_KEY\) must not start with dq: or dq-settings:",
        ),
    ],
)
def test_bad_settings_name_the_setting(env, named):
    with pytest.raises(ConfigError, match=named):
        ServiceConfig.from_env(env)


def test_bad_flag_choice_is_rejected_by_argparse():
    with pytest.raises(SystemExit):
        parse(["--topic-type", "carrier-pigeon"])


def test_derived_names():
    config = ServiceConfig(namespace="shop", topic="orders", member_id="")
    assert config.target_stream == "dq-out:shop/orders"
    assert config.member  # host-pid by default
    assert ServiceConfig(member_id="pod-1").member == "pod-1"


def test_ownership_follows_the_zookeeper_setting():
    from delayq.coordination.ownership import EmbeddedOwnership
    from delayq.coordination.zookeeper import ZkOwnership
    from delayq.service.serve import make_ownership

    assert isinstance(make_ownership(ServiceConfig()), EmbeddedOwnership)
    zk = make_ownership(ServiceConfig(zookeeper_connect="127.0.0.1:2181", member_id="m-1"))
    assert isinstance(zk, ZkOwnership)
    assert zk.member_id == "m-1"


@pytest.mark.parametrize(
    ("raw", "expected"), [("true", True), ("1", True), ("False", False), ("no", False)]
)
def test_a_boolean_variable_is_read_as_words(raw, expected):
    assert ServiceConfig.from_env({"DELAYQ_INSECURE_NO_AUTH": raw}).insecure_no_auth is expected


def test_a_boolean_flag_is_a_switch_and_survives_the_processes_environment():
    assert ServiceConfig.from_args(parse(["--insecure-no-auth"]), ServiceConfig()).insecure_no_auth
    assert not ServiceConfig.from_args(parse([]), ServiceConfig()).insecure_no_auth
    on = ServiceConfig(insecure_no_auth=True)
    assert ServiceConfig.from_env(config_env(on)) == on  # how `delayq dev` passes settings
    assert ServiceConfig.from_env(config_env(ServiceConfig())) == ServiceConfig()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LocalHost"])
def test_loopback_may_serve_without_a_token(host):
    check_exposure(ServiceConfig(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "fe80::1", "delayq.example"])
def test_beyond_loopback_a_token_or_the_insecure_switch_is_needed(host):
    with pytest.raises(ConfigError, match="--insecure-no-auth") as refused:
        check_exposure(ServiceConfig(host=host))
    assert "--api-token" in str(refused.value)
    check_exposure(ServiceConfig(host=host, api_token="t"))
    check_exposure(ServiceConfig(host=host, insecure_no_auth=True))


def test_private_targets_are_allowed_by_default_and_a_flag_or_variable_refuses_them():
    assert ServiceConfig().webhook_targets.refusal("127.0.0.1") is None
    off = ServiceConfig.from_args(
        parse(["--webhook-allow-private-targets", "false"]), ServiceConfig()
    )
    assert "loopback" in str(off.webhook_targets.refusal("127.0.0.1"))
    on = ServiceConfig.from_args(parse(["--webhook-allow-private-targets"]), off)
    assert on.webhook_allow_private_targets
    from_env = ServiceConfig.from_env({"DELAYQ_WEBHOOK_ALLOW_PRIVATE_TARGETS": "false"})
    assert from_env.webhook_targets.refusal("10.0.0.5") is not None


def test_http_webhooks_are_allowed_by_default_and_refused_when_insecure_http_is_off():
    """Run by hand, `serve` keeps posting to an http:// receiver; a pod's topic.json carries
    the topic's allowInsecureHttp (false unless set), and then only https:// is accepted."""
    hand_run = {"DELAYQ_TOPIC_TYPE": "webhook", "DELAYQ_WEBHOOK_URL": "http://127.0.0.1:9/h"}
    assert ServiceConfig.from_env(hand_run).webhook_allow_insecure_http
    refused = {**hand_run, "DELAYQ_WEBHOOK_ALLOW_INSECURE_HTTP": "false"}
    with pytest.raises(ConfigError, match="must start with https:// unless --webhook-allow-"):
        ServiceConfig.from_env(refused)
    secure = {**refused, "DELAYQ_WEBHOOK_URL": "https://hooks.example/h"}
    assert ServiceConfig.from_env(secure).webhook_url == "https://hooks.example/h"


def test_allowed_cidrs_are_comma_separated_and_checked():
    config = ServiceConfig(
        webhook_allow_private_targets=False, webhook_allowed_cidrs="10.96.0.0/12, fd00::/8"
    )
    assert config.webhook_targets.refusal("10.96.0.10") is None
    assert config.webhook_targets.refusal("fd00::1") is None
    assert config.webhook_targets.refusal("10.0.0.5") is not None
    with pytest.raises(ConfigError, match=r"--webhook-allowed-cidrs .*'10\.0\.0\.0/33'"):
        ServiceConfig(webhook_allowed_cidrs="10.0.0.0/8,10.0.0.0/33")


def test_every_engine_topic_setting_is_a_service_setting_carried_to_the_topic():
    """ServiceConfig is the flat settings surface (one field per flag and DELAYQ_* variable);
    the engine's Topic is built from it in one place, `to_topic`. Every Topic field but the
    name (the `topic` setting) is a setting of the same name, and a non-default value of each
    reaches the Topic: adding a Topic field without its setting fails here."""
    changed: dict[str, Any] = {
        "namespace": "shop",
        "slot_amount": 64,
        "topic_type": TopicType.WEBHOOK,
        "max_retries": 3,
        "ack_timeout_ms": 45_000,
        "max_payload_bytes": 2048,
        "journal_max_len": 500,
        "redis_sync_replicas": 1,
        "redis_sync_timeout_ms": 250,
        "redis_record_buckets": True,
        "redis_store_buckets": True,
        "redis_store_buckets_after_ms": 30_000,
        "outcome_retention_ms": 3_600_000,
        "retry_for_ms": 7_200_000,
        "retry_exhausted_action": EndAction.DROP,
        "expiry_ttl_ms": 600_000,
        "expiry_action": EndAction.DROP,
        "limits_max_pending": 1_000_000,
        "rate_limit_per_second": 250.0,
        "rate_limit_burst": 50,
        "max_in_flight_per_group": 8,
    }
    # the key generation is the routing node's (read and watched at run time), not a setting
    topic_fields = {f.name for f in dataclasses.fields(Topic)} - {"name"} - ROUTING_FIELDS
    assert topic_fields == set(changed)
    config = ServiceConfig(topic="orders", webhook_url="https://example.com/hook", **changed)
    topic = config.to_topic()
    assert topic.name == "orders"
    assert {name: getattr(topic, name) for name in changed} == changed


def test_a_stream_target_is_guarded_with_its_own_cidrs_and_a_socket_needs_the_opt_in():
    config = ServiceConfig(stream_allow_private_targets=False, stream_allowed_cidrs="10.96.0.0/12")
    assert config.stream_targets.refusal("10.96.0.10") is None
    assert "stream target 10.0.0.5 refused" in str(config.stream_targets.refusal("10.0.0.5"))
    with pytest.raises(ConfigError, match=r"--stream-allowed-cidrs .*'nowhere'"):
        ServiceConfig(stream_allowed_cidrs="nowhere")
    socket = "unix:///var/run/redis.sock"
    stream = TopicType.STREAM
    with pytest.raises(ConfigError, match=r"unix:// socket .* needs --stream-allow-private"):
        ServiceConfig(topic_type=stream, stream_url=socket, stream_allow_private_targets=False)
    assert ServiceConfig(topic_type=stream, stream_url=socket).stream_url == socket
