"""docs/service.md's table of topic settings, generated from the settings table (pure).

`python -m delayq.queue.settings_doc docs/service.md` rewrites the table between its markers;
tests/test_docs.py checks that the checked-in table is this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

from delayq.queue.settings import RULES, SETTINGS, Change, Consumer, Setting

BEGIN = (
    "<!-- BEGIN settings table: generated from operator/delayq/queue/settings.py by "
    "`python -m delayq.queue.settings_doc docs/service.md`, do not edit -->"
)
END = "<!-- END settings table -->"
HEADER = (
    "| `spec.` | `delayq serve` flag, variable | unit | default | range | obeyed by | a change "
    "| what |",
    "|---|---|---|---|---|---|---|---|",
)
_OBEYED_BY = {
    Consumer.TOPIC: "engine (`Topic`)",
    Consumer.SERVICE: "delay service",
    Consumer.OPERATOR: "operator",
}
_CHANGE = {
    Change.LIVE: "applies live",
    Change.ROLL: "rolls the pods",
    Change.GROW: "grows live, never shrinks",
    Change.NEVER: "immutable",
}


def markdown() -> str:
    """The table and the rules between settings, markers included."""
    rules = [f"- {rule.message}" for rule in RULES]
    intro = "Rules between settings (the CRD, the operator and `delayq serve` check each):"
    return "\n".join([BEGIN, *HEADER, *(_row(row) for row in SETTINGS), "", intro, "", *rules, END])


def region(text: str) -> str:
    """The generated table as it stands in a document (ValueError: no markers)."""
    start = text.index(BEGIN)
    return text[start : text.index(END, start) + len(END)]


def rewrite(text: str) -> str:
    return text.replace(region(text), markdown())


def _row(row: Setting) -> str:
    serve = f"`{row.flag}`, `{row.env}`" if row.serve else "—"
    default = f"`{_shown(row.crd_default())}`"
    if row.serve and row.serve_default is not None and row.serve_default != row.default:
        default += f" (serve run by hand: `{_shown(row.serve_default)}`)"
    cells = (
        f"`{row.path}`",
        serve,
        row.unit_shown,
        default,
        row.bounds_shown(),
        _OBEYED_BY[row.consumer],
        _CHANGE[row.change],
        row.help.replace("|", "\\|"),
    )
    return "| " + " | ".join(cells) + " |"


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


if __name__ == "__main__":  # pragma: no cover - the generator's command line
    path = Path(sys.argv[1])
    path.write_text(rewrite(path.read_text()))
