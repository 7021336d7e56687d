"""The settings table: every layer reads its rows, so a row's bounds and default hold everywhere."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from delayq.kube.spec import SpecError, TopicSpec, parse_spec
from delayq.queue.settings import (
    MAX_REPLICAS_PER_BROKER,
    RULES,
    SETTINGS,
    Consumer,
    Kind,
    Setting,
    human_duration,
)
from delayq.queue.topic import ROUTING_FIELDS, Topic, TopicError
from delayq.service.config import ConfigError, ServiceConfig

BOUNDED = [row for row in SETTINGS if row.kind in (Kind.INTEGER, Kind.DURATION, Kind.NUMBER)]


def test_the_engine_topic_is_the_table_s_engine_rows() -> None:
    """Topic's fields are the rows consumed by the engine, with their defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(Topic)}
    engine = {row.name: row.default for row in SETTINGS if row.consumer is Consumer.TOPIC}
    assert set(fields) - {"name", "namespace", *ROUTING_FIELDS} == set(engine)
    assert {name: fields[name] for name in engine} == engine


def test_every_row_is_a_field_of_the_operator_and_of_serve() -> None:
    """TopicSpec holds every row (delivery ones in Delivery); ServiceConfig every serve row."""
    spec = TopicSpec("orders", "shop")
    config = {f.name for f in dataclasses.fields(ServiceConfig)}
    for row in SETTINGS:
        assert spec.setting(row.name) == row.default, row.name
        assert (row.name in config) == row.serve, row.name


def test_names_and_units_follow_the_path() -> None:
    """One name per setting: the snake_case path, `_ms` for a duration (milliseconds)."""
    for row in SETTINGS:
        assert row.name.endswith("_ms") == (row.kind is Kind.DURATION), row.name
        assert row.name.replace("_", "") == (
            row.path.removeprefix("delivery.").replace(".", "").lower()
            + ("ms" if row.kind is Kind.DURATION else "")
        )
        assert row.help, row.name
        assert row.description, row.name
        assert row.kind not in (Kind.INTEGER, Kind.NUMBER) or row.unit, row.name


def _spec_of(row: Setting, value: int | float) -> dict[str, object]:
    """A spec setting `row` to `value`, as the CRD writes it."""
    written: object = human_duration(int(value)) if row.kind is Kind.DURATION else value
    spec: dict[str, object] = {row.key: written}
    for part in reversed(row.section):
        spec = {part: spec}
    if row.path.startswith("delivery.webhook."):
        spec = {**spec, "topicType": "webhook", "ackTimeout": "24h"}
        spec["delivery"]["webhook"]["url"] = "https://h.example/d"  # type: ignore[index]
    if row.path.startswith("delivery.stream."):
        spec = {**spec, "topicType": "stream"}
    return spec


@pytest.mark.parametrize("row", BOUNDED, ids=lambda row: row.path)
def test_the_parser_takes_the_bounds_and_refuses_beyond(row: Setting) -> None:
    """The bounds the CRD says are the parser's: a bound is accepted, one beyond it refused
    naming the path (the rules between settings are kept by the neighbours' values)."""
    context = {"slotAmount": 64, "replicasPerBroker": 5, "retry": {"backoffMax": "168h"}}
    if row.path == "retry.backoffMax":
        context["retry"] = {"backoffBase": "1ms"}
    if row.path == "slotAmount":
        context = {"brokers": 1}
    # a rule bounds it more than its range: syncReplicas <= replicasPerBroker <= 5
    high = MAX_REPLICAS_PER_BROKER if row.path == "redis.syncReplicas" else row.high
    for value in (row.low, high):
        parse_spec("orders", "shop", _merge(context, _spec_of(row, value)))
    step = 1 if row.kind is not Kind.NUMBER else 0.5
    for value in (row.low - step, row.high + step):
        if row.kind is Kind.DURATION and value < 0:
            continue  # not writable as a duration
        with pytest.raises(SpecError, match=row.path.replace(".", r"\.")):
            parse_spec("orders", "shop", _merge(context, _spec_of(row, value)))


ENGINE_BOUNDED = [
    row for row in BOUNDED if row.consumer is Consumer.TOPIC and row.name != "slot_amount"
]  # the slot amount is a power of two, checked on its own


@pytest.mark.parametrize("row", ENGINE_BOUNDED, ids=lambda row: row.path)
def test_the_engine_refuses_what_the_table_refuses(row: Setting) -> None:
    at_bound: dict[str, Any] = {row.name: int(row.high)}
    beyond: dict[str, Any] = {row.name: int(row.high) + 1}
    Topic("orders", **at_bound)
    with pytest.raises(TopicError, match=row.path.replace(".", r"\.")):
        Topic("orders", **beyond)


def test_the_engines_delivery_settings_reach_the_operators_topic() -> None:
    """The rate limit lives under spec.delivery (TopicSpec.delivery), the engine's Topic has it
    flat: the operator's Topic, which it publishes in the settings record, carries it."""
    spec = parse_spec("orders", "shop", {"delivery": {"rateLimit": {"perSecond": 250.5,
                                                                     "burst": 40}}})  # fmt: skip
    assert (spec.topic.rate_limit_per_second, spec.topic.rate_limit_burst) == (250.5, 40)
    with pytest.raises(TopicError, match=r"delivery\.rateLimit\.perSecond"):
        Topic("orders", rate_limit_per_second=-0.5)


def test_bounds_are_written_out_in_messages() -> None:
    """10000000000, not 1e+10: the user types the number the message names."""
    with pytest.raises(SpecError, match=r"between 0 and 10000000000, got 10000000001$"):
        parse_spec("orders", "shop", {"limits": {"maxPending": 10_000_000_001}})
    with pytest.raises(ConfigError, match=r"between 0 and 10000000000 \(got 10000000001\)"):
        ServiceConfig(limits_max_pending=10_000_000_001)


def test_serve_refuses_beyond_the_tables_bounds_naming_the_flag() -> None:
    """A hand-run serve keeps the CRD's bounds too (it took any worker_concurrency before)."""
    assert ServiceConfig(worker_concurrency=1024).worker_concurrency == 1024
    with pytest.raises(ConfigError, match=r"--worker-concurrency \(DELAYQ_WORKER_CONCURRENCY\)"):
        ServiceConfig(worker_concurrency=1025)
    with pytest.raises(ConfigError, match="--retry-backoff-multiplier"):
        ServiceConfig(retry_backoff_multiplier=0.5)
    # every choice of the table, topicType too (a bare ValueError before)
    with pytest.raises(ConfigError, match=r"--topic-type .* must be pull or webhook or stream"):
        ServiceConfig(topic_type="kafka")  # type: ignore[arg-type]


def test_every_rule_names_settings_of_the_table_and_says_the_first() -> None:
    paths = {row.name: row.path for row in SETTINGS}
    for rule in RULES:
        assert set(rule.names) <= set(paths), rule.names
        assert rule.message.startswith(paths[rule.names[0]]), rule.message
        assert rule.field_path.lstrip(".") in paths[rule.names[0]]


def _merge(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    merged = dict(base)
    for key, value in extra.items():
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged
