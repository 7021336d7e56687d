"""The CRD: one source of truth, a structural schema that accepts/rejects the examples.

CEL rules run only on a real API server (the e2e suite applies the same examples there); here
every invalid example must be rejected by the OpenAPI schema or by the operator's own parser,
which repeats each non-transition CEL rule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from delayq.kube.spec import SpecError, parse_duration_ms, parse_spec
from delayq.service.defaults import DEFAULTS, TopicDefaults, crd_default, crd_path

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "delaytopics.delayq.io.yaml"
CHART_CRD_PATH = ROOT / "charts" / "delayq" / "crds" / "delaytopics.delayq.io.yaml"
EXAMPLES = ROOT / "examples"


def crd() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


def openapi_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return to_jsonschema(schema)


def to_jsonschema(node: Any) -> Any:
    """Drop Kubernetes-only keywords (x-kubernetes-*) so jsonschema sees plain OpenAPI v3."""
    if isinstance(node, dict):
        return {k: to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if isinstance(node, list):
        return [to_jsonschema(item) for item in node]
    return node


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(openapi_schema())
    return [error.message for error in validator.iter_errors(document)]


def expected_error(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect-error: "), f"{path} must start with # expect-error:"
    return first.removeprefix("# expect-error: ")


def parser_error(document: dict[str, Any]) -> str | None:
    meta = document["metadata"]
    try:
        parse_spec(meta["name"], meta.get("namespace", "default"), document.get("spec") or {})
    except SpecError as error:
        return str(error)
    return None


def test_chart_copy_is_byte_identical() -> None:
    assert CHART_CRD_PATH.read_bytes() == CRD_PATH.read_bytes(), (
        "charts/delayq/crds/ must be a copy of crds/: cp crds/*.yaml charts/delayq/crds/"
    )


def test_names_scope_and_printer_columns() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "delayq.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "DelayTopic"
    assert spec["names"]["plural"] == "delaytopics"
    assert spec["names"]["shortNames"] == ["dt"]
    assert spec["names"]["categories"] == ["delayq"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns[:4] == ["Slots", "Type", "Brokers", "Ready"]
    assert "Age" in columns


def walk_rules(node: Any) -> list[dict[str, str]]:
    rules: list[dict[str, str]] = []
    if isinstance(node, dict):
        rules += node.get("x-kubernetes-validations", [])
        for value in node.values():
            rules += walk_rules(value)
    elif isinstance(node, list):
        for item in node:
            rules += walk_rules(item)
    return rules


def test_every_cel_rule_has_a_message() -> None:
    rules = walk_rules(crd())
    assert len(rules) >= 10
    for rule in rules:
        assert len(rule.get("message", "")) > 20, rule


def test_transition_rules_cover_immutability_and_growth() -> None:
    properties = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    assert {"rule": "self == oldSelf"}.items() <= properties["topicType"][
        "x-kubernetes-validations"
    ][0].items()
    assert any(
        r["rule"] == "self >= oldSelf" for r in properties["slotAmount"]["x-kubernetes-validations"]
    )
    assert any(
        r["rule"] == "self >= oldSelf" for r in properties["brokers"]["x-kubernetes-validations"]
    )


def test_every_number_is_bounded() -> None:
    def check(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer" and not path.startswith("status"):
                assert {"minimum", "maximum"} <= node.keys(), path
            for key, value in node.get("properties", {}).items():
                check(value, f"{path}.{key}" if path else key)

    check(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


@pytest.mark.parametrize("path", sorted((EXAMPLES / "valid").glob("*.yaml")), ids=lambda p: p.stem)
def test_valid_examples_pass_schema_and_parser(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    assert schema_errors(document) == []
    assert parser_error(document) is None


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.stem
)
def test_invalid_examples_are_rejected(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    errors = schema_errors(document)
    from_parser = parser_error(document)
    assert errors or from_parser, f"{path.name} was accepted by both the schema and the parser"
    expected = expected_error(path)
    if from_parser and not expected.startswith("spec."):
        # The parser repeats the CEL rule, so its message must be the one kubectl shows.
        assert expected in from_parser


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "transitions").glob("*.yaml")), ids=lambda p: p.stem
)
def test_transition_examples_are_individually_valid(path: Path) -> None:
    """Each side is valid alone; only the change is rejected (by a CEL transition rule)."""
    before, after = yaml.safe_load_all(path.read_text())
    assert before["metadata"]["name"] == after["metadata"]["name"]
    for document in (before, after):
        assert schema_errors(document) == []
        assert parser_error(document) is None
    message = expected_error(path)
    assert any(rule["message"].startswith(message) for rule in walk_rules(crd()))


def crd_defaults(properties: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every `default:` under the spec, by its dotted path (`delivery.webhook.timeout`)."""
    found: dict[str, Any] = {}
    for name, node in properties.items():
        path = f"{prefix}{name}"
        if "default" in node:
            found[path] = node["default"]
        found.update(crd_defaults(node.get("properties", {}), f"{path}."))
    return found


def test_every_crd_default_is_the_one_of_the_defaults_table() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    in_crd = crd_defaults(spec["properties"])
    table = {crd_path(f.name): f.name for f in dataclasses.fields(TopicDefaults)}
    assert sorted(in_crd) == sorted(table)
    for path, value in in_crd.items():
        name = table[path]
        if name.endswith("_ms"):
            assert parse_duration_ms(value, path, 0, 10**9) == getattr(DEFAULTS, name), path
        assert value == crd_default(name), path


def test_the_parser_defaults_an_empty_spec_from_the_table() -> None:
    """TopicSpec's names are the table's (one name per setting), so every default matches."""
    parsed = parse_spec("orders", "shop", {})
    for f in dataclasses.fields(TopicDefaults):
        where = parsed.delivery if hasattr(parsed.delivery, f.name) else parsed
        assert getattr(where, f.name) == getattr(DEFAULTS, f.name), f.name
