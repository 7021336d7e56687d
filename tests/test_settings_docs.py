"""The docs say what the settings table holds: docs/service.md's generated table, and the
glossary of docs/architecture.md (each concept, its settings with their units, its HTTP names)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from delayq.queue.settings import SETTINGS
from delayq.queue.settings_doc import markdown, region

REPO = Path(__file__).resolve().parent.parent


def test_the_settings_table_of_the_docs_is_the_generated_one() -> None:
    text = (REPO / "docs" / "service.md").read_text()
    assert region(text) == markdown(), (
        "docs/service.md's settings table is stale: "
        "python -m delayq.queue.settings_doc docs/service.md"
    )


def glossary() -> dict[str, tuple[str, str]]:
    """The glossary's rows by word: (settings cell, HTTP cell)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## Glossary") : text.index("### One name per setting")]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| **"):
            assert len(cells) == 5, line
            rows[cells[0].strip("*")] = (cells[2], cells[3])
    return rows


#: A setting named in the settings column: `path` and, in parentheses, its unit.
SETTING = re.compile(r"`([A-Za-z0-9.]+)`(?: \(([^)]+)\))?")


def test_the_glossary_gives_every_setting_one_word_and_its_unit() -> None:
    """Each setting of the table once, under one word, with the table's unit (none for a
    choice or a switch): a new row, a changed unit or a renamed path fails here."""
    named: list[tuple[str, str]] = []
    for settings, _ in glossary().values():
        named += [(path, unit) for path, unit in SETTING.findall(settings)]
    paths = [path for path, _ in named]
    assert sorted(paths) == sorted(row.path for row in SETTINGS)
    table = {row.path: row.unit_shown for row in SETTINGS}
    assert {path: unit for path, unit in named} == table


def openapi_fields() -> set[str]:
    """Every property name of docs/openapi.yaml's schemas."""
    names: set[str] = set()
    stack: list[object] = [yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names.update(
                node.get("properties", {}) if isinstance(node.get("properties"), dict) else ()
            )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def test_the_glossary_s_http_names_are_the_openapi_document_s() -> None:
    """The HTTP column is data: renaming a field in the API (docs/openapi.yaml) without the
    glossary, or the other way round, fails here; edit the glossary row to follow."""
    fields = openapi_fields()
    named = {word: re.findall(r"`([A-Za-z]+)`", http) for word, (_, http) in glossary().items()}
    missing = {word: sorted(set(names) - fields) for word, names in named.items()}
    assert {word: names for word, names in missing.items() if names} == {}
    assert sum(len(names) for names in named.values()) >= 20
