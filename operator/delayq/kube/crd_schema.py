"""The DelayTopic CRD, its settings' schema generated from the settings table (pure).

`python -m delayq.kube.crd_schema > crds/delaytopics.delayq.io.yaml` (then copy it to
charts/delayq/crds/): the hand-written skeleton next to this module holds everything but the
settings (status, printer columns, the Secret references, the network policy, the rules that
are not a setting's), with one placeholder line where a section's settings or the table's
cross-field rules go:

    {{settings delivery.webhook}}   the properties of the rows in spec.delivery.webhook, in the
                                    table's order ("spec": the rows directly under spec)
    {{rules retry}}                 the RULES checked on spec.retry ("spec": on spec)

A row in a section with no placeholder is an error: a new section needs its placeholder.

tests/kube/test_crd_schema.py checks that the checked-in copies are this output.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import resources
from typing import Any

import yaml

from delayq.queue.settings import (
    DURATION_PATTERN,
    RULES,
    SETTINGS,
    Kind,
    Rule,
    Setting,
    human_duration,
)

SKELETON = "delaytopics.skeleton.yaml"
PLACEHOLDER = re.compile(r"^(\s*)(?:- )?\{\{(settings|rules) ([A-Za-z.]+)\}\}$")
#: The CRD's bound on a duration string: "1m30s" and friends are short.
DURATION_MAX_LENGTH = 32


def property_schema(row: Setting) -> dict[str, Any]:
    """The OpenAPI schema of one setting, as the CRD declares it."""
    schema: dict[str, Any] = {}
    if row.kind in (Kind.INTEGER, Kind.NUMBER):
        schema["type"] = str(row.kind)
        schema.update({k: v for k, v in row.crd.items() if k == "format"})
        schema["minimum"] = _plain_number(row.low)
        schema["maximum"] = _plain_number(row.high)
    elif row.kind is Kind.BOOLEAN:
        schema["type"] = "boolean"
    else:
        schema["type"] = "string"
        if row.kind is Kind.CHOICE:
            schema["enum"] = list(row.choices)
    schema["default"] = row.crd_default()
    if row.kind is Kind.DURATION:
        schema["pattern"] = DURATION_PATTERN
        schema["maxLength"] = DURATION_MAX_LENGTH
    schema.update({k: v for k, v in row.crd.items() if k in ("maxLength", "pattern")})
    schema["description"] = row.description
    rules = [*_range_rules(row), *row.crd.get("x-kubernetes-validations", ())]
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def rule_schema(rule: Rule) -> dict[str, str]:
    """One cross-field rule as a CEL rule of the object at `rule.at`."""
    schema = {"rule": rule.cel, "fieldPath": rule.field_path, "message": rule.message}
    if rule.message_expression:
        schema["messageExpression"] = rule.message_expression
    return schema


def render(skeleton: str) -> str:
    """The skeleton with every placeholder replaced by its generated YAML."""
    out: list[str] = []
    rendered: list[Setting] = []
    for line in skeleton.splitlines():
        match = PLACEHOLDER.match(line)
        if match is None:
            out.append(line)
            continue
        indent, what, name = match.groups()
        if what == "settings":
            section = () if name == "spec" else tuple(name.split("."))
            for row in (row for row in SETTINGS if row.section == section):
                out.append(f"{indent}{row.key}:")
                out.extend(_emit(property_schema(row), len(indent) + 2))
                rendered.append(row)
        else:
            at = "" if name == "spec" else name
            items = [rule_schema(rule) for rule in RULES if rule.at == at]
            out.extend(_emit(items, len(indent)))
    missing = [row.path for row in SETTINGS if row not in rendered]
    if missing or len(rendered) != len(SETTINGS):
        raise ValueError(f"the skeleton has no (or two) {{{{settings}}}} places for {missing}")
    return "\n".join(out) + "\n"


def generate() -> str:
    skeleton = resources.files("delayq.kube").joinpath(SKELETON).read_text()
    return render(skeleton)


def _range_rules(row: Setting) -> list[dict[str, str]]:
    """A duration's bounds, which the schema cannot say of a string: a CEL rule."""
    if row.kind is not Kind.DURATION:
        return []
    low, high = human_duration(int(row.low)), human_duration(int(row.high))
    upper = f"duration(self) <= duration('{high}')"
    rule = upper if row.low == 0 else f"duration(self) >= duration('{low}') && {upper}"
    message = f"{row.path} must be between {low} and {high}{row.bound_hint}"
    return [{"rule": rule, "message": message}]


def _plain_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _emit(value: Any, indent: int) -> list[str]:
    """Block-style YAML of mappings, lists and scalars, in the skeleton's style."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item and not _flow_list(item):
                lines.append(f"{pad}{key}:")
                lines.extend(_emit(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item, key)}")
        return lines
    for item in value:
        first, *rest = _emit(item, indent + 2)
        lines.append(f"{pad}- {first.lstrip()}")
        lines.extend(rest)
    return lines


def _flow_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


#: The skeleton's style: CEL and its messages double-quoted, patterns single-quoted.
_QUOTED = {"rule": '"', "message": '"', "messageExpression": '"', "pattern": "'"}


def _scalar(value: Any, key: str = "") -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(item) for item in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    quote = _QUOTED.get(key, "")
    if not quote and _plain_safe(text):
        return text
    if quote == "'" or "\\" in text:
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text, ensure_ascii=False)


_INDICATORS = "-?:,[]{}#&*!|>'\"%@`"


def _plain_safe(text: str) -> bool:
    """A string YAML reads back as the same string when written bare."""
    if not text or text != text.strip() or ": " in text or " #" in text or text[0] in _INDICATORS:
        return False
    try:
        return bool(yaml.safe_load(f"k: {text}") == {"k": text})
    except yaml.YAMLError:
        return False


if __name__ == "__main__":  # pragma: no cover - the generator's command line
    sys.stdout.write(generate())
