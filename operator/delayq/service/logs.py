"""JSON log lines (one object per line) so log pipelines index fields, not prose."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestPayloadError

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg, any `extra=` fields, and the exception text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (bad request line, header, chunking, a body not
    in its Content-Encoding, which the API answered 400 before aiohttp read on in it) at ERROR
    with a traceback, as if the server had failed: a client's mistake becomes one WARNING line
    naming it, without the traceback. A failure of our own handlers stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, RequestPayloadError):  # the body's parse error is its cause
            error = error.__cause__
        if isinstance(error, HttpProcessingError) and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args, record.exc_info = "malformed HTTP request", (), None
            record.error = f"{type(error).__name__}: {error.message}"
        return True


def configure(level: str) -> None:
    """Route the root logger to stderr as JSON at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.server").addFilter(MalformedRequests())
