"""The docs say what the settings table holds: docs/service.md's generated table, and the
glossary of docs/architecture.md (each concept, its settings with their units, its HTTP names)."""

from __future__ import annotations

from pathlib import Path

from delayq.queue.settings_doc import markdown, region

REPO = Path(__file__).resolve().parent.parent


def test_the_settings_table_of_the_docs_is_the_generated_one() -> None:
    text = (REPO / "docs" / "service.md").read_text()
    assert region(text) == markdown(), (
        "docs/service.md's settings table is stale: "
        "python -m delayq.queue.settings_doc docs/service.md"
    )
