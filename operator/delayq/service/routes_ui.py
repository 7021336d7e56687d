"""The dashboard's files: `/ui` (the page) and `/ui/<asset>` (its script and style sheet).

Everything the page needs ships in the package (`service/ui/`): no CDN, no network at run
time, so a dashboard works in an air-gapped cluster. The files hold no data and are served
without a token; the page asks for one and sends it as a bearer token to the same JSON routes
every client uses, so the dashboard can do nothing a token holder cannot do with curl.

Every answer carries a Content-Security-Policy that allows scripts and styles from this origin
only and no inline script: even if a message id or payload ever reached the page as markup, it
could not run. (The page itself only ever writes data as text.)
"""

from __future__ import annotations

import html
import re
from functools import cache
from importlib import resources

from aiohttp import web

from delayq.service.http_support import SERVICE

UI = "/ui"
ASSET_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_ASSET = re.compile(ASSET_NAME)
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(UI, page)
    router.add_get(UI + "/{asset:" + ASSET_NAME + "}", asset)


def is_ui_path(path: str) -> bool:
    return path == UI or path.startswith(UI + "/")


@cache
def _files() -> dict[str, bytes]:
    """The shipped assets by name, read once (a handful of small files)."""
    folder = resources.files("delayq.service") / "ui"
    return {
        item.name: item.read_bytes()
        for item in folder.iterdir()
        if item.is_file() and _ASSET.fullmatch(item.name) and _suffix(item.name) in CONTENT_TYPES
    }


def _suffix(name: str) -> str:
    return name[name.rfind(".") :] if "." in name else ""


def _answer(body: bytes, name: str) -> web.Response:
    response = web.Response(body=body, content_type=CONTENT_TYPES[_suffix(name)], charset="utf-8")
    response.headers.update(SECURITY_HEADERS)
    return response


async def page(request: web.Request) -> web.Response:
    """The page, naming the served topic (HTML-escaped) so the script knows which API to call."""
    topic = request.app[SERVICE].topic
    text = _files()["index.html"].decode("utf-8")
    text = text.replace("{{topic}}", html.escape(topic.name, quote=True))
    text = text.replace("{{namespace}}", html.escape(topic.namespace, quote=True))
    return _answer(text.encode("utf-8"), "index.html")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["asset"]
    body = _files().get(name)
    if body is None or name == "index.html":
        raise web.HTTPNotFound(reason=f"no dashboard file {name!r}")
    return _answer(body, name)
