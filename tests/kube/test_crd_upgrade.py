"""Upgrading the CRD keeps every stored DelayTopic valid: the topics release 0.1.0 stored (its
valid examples, with the defaults its CRD made the API server write into them) pass the
current CRD's structural schema and the operator's parser.

CEL rules run only on a real API server; the parser repeats each non-transition rule
(tests/kube/test_crd_schema.py), and a stored object is checked by the API server's
transition rules only when it changes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.kube.test_crd_schema import parser_error, schema_errors, to_jsonschema

PREVIOUS = Path(__file__).resolve().parent / "crd_0_1_0"


def previous_schema() -> dict[str, Any]:
    crd = yaml.safe_load((PREVIOUS / "delaytopics.delayq.io.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def defaulted(node: Any, schema: dict[str, Any]) -> Any:
    """`node` as the API server stores it: structural defaulting, every absent property with
    a `default` set (recursively into present and defaulted objects and array items)."""
    if isinstance(node, dict) and "properties" in schema:
        out = dict(node)
        for name, child in schema["properties"].items():
            if name not in out and "default" in child:
                out[name] = copy.deepcopy(child["default"])
            if name in out:
                out[name] = defaulted(out[name], child)
        return out
    if isinstance(node, list) and "items" in schema:
        return [defaulted(item, schema["items"]) for item in node]
    return node


def stored_topics() -> list[tuple[str, dict[str, Any]]]:
    schema = previous_schema()
    return [
        (path.stem, defaulted(yaml.safe_load(path.read_text()), schema))
        for path in sorted(PREVIOUS.glob("*.yaml"))
        if path.name != "delaytopics.delayq.io.yaml"
    ]


TOPICS = stored_topics()


# Refused on purpose since 0.1.0, each named by CHANGELOG "Upgrading from 0.1.0" with what the
# user changes before upgrading: the field, and the change.
DOCUMENTED_BREAKS = {
    # `spec.zookeeper.connect` may no longer hold a /chroot (the platform's ensembles only)
    "callbacks-webhook": (
        ("spec", "zookeeper", "connect"),
        "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181",
    ),
}


def test_the_stored_topics_were_valid_and_defaulted_by_the_previous_crd() -> None:
    validator = jsonschema.Draft7Validator(to_jsonschema(previous_schema()))
    assert len(TOPICS) == 5
    for name, topic in TOPICS:
        assert [e.message for e in validator.iter_errors(topic)] == [], name
        raw = yaml.safe_load((PREVIOUS / f"{name}.yaml").read_text())
        assert topic != raw, name  # defaulted: what the API server stored


@pytest.mark.parametrize(("name", "topic"), TOPICS, ids=[name for name, _ in TOPICS])
def test_a_topic_the_previous_crd_stored_is_valid_under_the_current_one(
    name: str, topic: dict[str, Any]
) -> None:
    if name in DOCUMENTED_BREAKS:
        path, fixed = DOCUMENTED_BREAKS[name]
        errors = schema_errors(topic)
        assert len(errors) == 1
        assert repr(get(topic, path)) in errors[0]
        topic = copy.deepcopy(topic)
        get(topic, path[:-1])[path[-1]] = fixed  # the change the upgrade notes ask for
    assert schema_errors(topic) == []
    assert parser_error(topic) is None


def get(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        node = node[key]
    return node
