"""The audit's HTML report: one self-contained file, inline SVG plots, no script, no CDN.

A person opens it from a laptop or a CI artifact without network access, so everything it needs
(styles, plots) is inside the page. Rendering is a pure function of the audit's JSON document.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

WIDTH, HEIGHT, MARGIN = 720, 240, 40
FIGURES = (
    ("deliveries", "deliveries", "{:,}"),
    ("lateness_p50", "p50 ms", "{:,}"),
    ("lateness_p95", "p95 ms", "{:,}"),
    ("lateness_p99", "p99 ms", "{:,}"),
    ("lateness_max", "max ms", "{:,}"),
    ("deliveries_per_minute", "per min", "{:,.1f}"),
    ("retry_rate", "retry rate", "{:.2%}"),
    ("dead_letter_rate", "dead rate", "{:.2%}"),
    ("early", "early", "{:,}"),
    ("duplicates", "duplicates", "{:,}"),
    ("lost", "lost", "{:,}"),
)
ALARMS = ("early", "duplicates", "lost")  # any non-zero value here is a broken promise

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
th { background: #f4f4f4; }
td.alarm { background: #fdd; font-weight: bold; }
svg { border: 1px solid #ddd; margin: 0.5em 1em 0.5em 0; }
.ok { color: #070; } .bad { color: #b00; }
"""


def _text(value: object) -> str:
    return html.escape(str(value))


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    alarm = key in ALARMS and bool(value)
    shown = "-" if value is None else fmt.format(value)
    return f'<td class="alarm">{shown}</td>' if alarm else f"<td>{shown}</td>"


def table(rows: Sequence[dict[str, Any]], first: str) -> str:
    head = f"<th>{_text(first)}</th>" + "".join(f"<th>{_text(t)}</th>" for _, t, _ in FIGURES)
    body = "".join(
        f"<tr><th>{_text(row.get(first, ''))}</th>"
        + "".join(_cell(row, key, fmt) for key, _, fmt in FIGURES)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _axes(title: str, x_label: str, y_max: float) -> str:
    bottom, right = HEIGHT - MARGIN, WIDTH - 10
    return (
        f'<text x="{MARGIN}" y="16" font-weight="bold">{_text(title)}</text>'
        f'<line x1="{MARGIN}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>'
        f'<line x1="{MARGIN}" y1="{MARGIN - 10}" x2="{MARGIN}" y2="{bottom}" stroke="#444"/>'
        f'<text x="{MARGIN - 4}" y="{MARGIN - 6}" text-anchor="end" font-size="11">'
        f"{y_max:,.0f}</text>"
        f'<text x="{right}" y="{HEIGHT - 8}" text-anchor="end" font-size="11">'
        f"{_text(x_label)}</text>"
    )


def histogram_svg(low: int, width: int, counts: Sequence[int]) -> str:
    """Bars of claims per lateness bin; bins below zero (early deliveries) drawn in red."""
    peak = max(counts, default=0) or 1
    plot_w, plot_h = WIDTH - MARGIN - 10, HEIGHT - 2 * MARGIN + 10
    bar_w = plot_w / max(1, len(counts))
    bars = []
    for i, count in enumerate(counts):
        h = plot_h * count / peak
        x, y = MARGIN + i * bar_w, HEIGHT - MARGIN - h
        color = "#c33" if low + i * width < 0 else "#48c"
        start = low + i * width
        bars.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" '
            f'fill="{color}"><title>{start:,}..{start + width - 1:,} ms: {count:,}</title></rect>'
        )
    high = low + width * len(counts)
    label = f"lateness {low:,} .. {high:,} ms"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'class="histogram">{_axes("Lateness histogram", label, peak)}{"".join(bars)}</svg>'
    )


def _polyline(values: Sequence[int], peak: float, color: str) -> str:
    plot_w, plot_h = WIDTH - MARGIN - 10, HEIGHT - 2 * MARGIN + 10
    step = plot_w / max(1, len(values) - 1)
    points = " ".join(
        f"{MARGIN + i * step:.1f},{HEIGHT - MARGIN - plot_h * v / peak:.1f}"
        for i, v in enumerate(values)
    )
    return f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"/>'


def timeline_svg(
    start_ms: int, bucket_ms: int, due: Sequence[int], delivered: Sequence[int]
) -> str:
    """Claims per bucket by due time (grey) and by delivery time (blue)."""
    peak = max([*due, *delivered, 1])
    begin = datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")
    label = f"from {begin} UTC, {bucket_ms // 1000:,} s per point"
    legend = (
        f'<text x="{WIDTH - 200}" y="16" fill="#888" font-size="12">— due</text>'
        f'<text x="{WIDTH - 120}" y="16" fill="#26a" font-size="12">— delivered</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'class="timeline">{_axes("Due vs delivered", label, peak)}{legend}'
        f"{_polyline(due, peak, '#888')}{_polyline(delivered, peak, '#26a')}</svg>"
    )


def _topic_section(topic: dict[str, Any]) -> str:
    name = f"{topic['namespace']}/{topic['topic']}"
    total = topic["total"]
    verdict = all(not total.get(key) for key in ALARMS)
    status = (
        '<p class="ok">No early, duplicate or lost delivery.</p>'
        if verdict
        else '<p class="bad">Broken promises: see the highlighted cells and ids below.</p>'
    )
    plots = topic["plots"]
    hist, line = plots["lateness_histogram"], plots["timeline"]
    ids = "".join(
        f"<li>{_text(kind)}: {', '.join(_text(i) for i in values)}</li>"
        for kind, values in sorted(topic["ids"].items())
        if values
    )
    return (
        f"<section><h2>{_text(name)}</h2>{status}"
        f"<p>Journal from {_text(_iso(total['start_ms']))} to {_text(_iso(total['end_ms']))}; "
        f"{total['scheduled']:,} ids scheduled, {total['dead']:,} dead.</p>"
        f"{table([{**total, 'scope': 'topic'}], 'scope')}"
        f"{histogram_svg(hist['low'], hist['width'], hist['counts'])}"
        f"{timeline_svg(line['start_ms'], line['bucket_ms'], line['due'], line['delivered'])}"
        f"<h3>Per slot</h3>{table(topic['slots'], 'slot')}"
        f"{f'<h3>Flagged ids (first few)</h3><ul>{ids}</ul>' if ids else ''}</section>"
    )


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def render(document: dict[str, Any]) -> str:
    """The whole report page for the audit JSON `document`."""
    sections = "".join(_topic_section(t) for t in document["topics"]) or "<p>Empty journal.</p>"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>delayq delivery audit</title><style>{STYLE}</style></head><body>"
        f"<h1>delayq delivery audit</h1><p>Generated {_text(document['generated_at'])}, "
        f"grace {document['grace_ms']:,} ms, input {_text(document['input'])}.</p>"
        f"{sections}</body></html>"
    )
