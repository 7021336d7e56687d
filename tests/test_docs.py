"""The docs cite only files the repository has (issue 13: they cited a design file that was
never in it, and later `e2e/harness.py` after the harness became a package).

CHANGELOG.md is left out: it records files as they were, removed ones included.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "charts" / "delayq" / "README.md",
        REPO / "examples" / "README.md",
    ]
)
TOP = "docs|operator|tests|e2e|bench|charts|examples|scripts|crds"
# a path from the repository's root: `e2e/conftest.py`, `charts/delayq/values.yaml`
ROOTED = re.compile(rf"\b(?:{TOP})/[\w./-]+\.(?:md|py|yaml|json|sh|lua|txt|toml)\b")
# a module named from the package's root, as the docs do: `kube/events.py`, `queue/keys.py`
PACKAGE = re.compile(r"`((?:kube|queue|service|coordination|pipeline|local)/[\w./-]+\.(?:py|lua))`")
# a Markdown link to a file, relative to the document: [e2e](docs/e2e.md), (../charts/...)
LINK = re.compile(r"\]\(((?!https?:|#|mailto:)[^)#\s]+)")


def cited(doc: Path) -> set[Path]:
    text = doc.read_text()
    found = {REPO / path for path in ROOTED.findall(text)}
    found |= {REPO / "operator" / "delayq" / path for path in PACKAGE.findall(text)}
    found |= {(doc.parent / path).resolve() for path in LINK.findall(text)}
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO)))
def test_every_cited_file_exists(doc: Path) -> None:
    missing = sorted(str(path.relative_to(REPO)) for path in cited(doc) if not path.exists())
    assert missing == [], f"{doc.relative_to(REPO)} cites files the repository lacks"
