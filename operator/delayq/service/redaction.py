"""How a target URL is shown in logs, errors, status and Events: without its secrets (pure).

A tenant's webhook URL (or a stream target's Redis URL) may carry credentials: a
`user:password@`, a token in the query, or one in the path (many receivers' URLs are their
secret). Every message that names a target shows `redact_url(url)`: scheme, host and port
only, which is what locating a failing receiver needs; the full URL stays in the setting (a
Secret on Kubernetes, `delivery.webhook.urlSecretRef`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

#: What stands for the path and query a redacted URL leaves out.
HIDDEN = "/…"


def redact_url(url: str) -> str:
    """`scheme://host[:port]` of `url`, with `/…` when it had more; never its user, password,
    path, query or fragment (an unparseable URL is shown as `<unparseable URL>`)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    shown = f"{parts.scheme}://{host}" + ("" if port is None else f":{port}")
    rest = parts.path not in ("", "/") or bool(parts.query) or bool(parts.fragment)
    return shown + (HIDDEN if rest else "")


def without_url(text: str, url: str) -> str:
    """`text` (a library's error message) with every copy of `url` redacted, the forms a
    library prints it in included (with and without a trailing slash)."""
    for form in sorted({url, url.rstrip("/")}, key=len, reverse=True):
        if form:
            text = text.replace(form, redact_url(url))
    return text
