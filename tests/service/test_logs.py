"""JSON log lines: extra fields and exceptions."""

from __future__ import annotations

import json
import logging
import sys

from delayq.service.logs import JsonFormatter


def test_json_log_lines_carry_extra_fields_and_exceptions():
    record = logging.makeLogRecord(
        {"name": "delayq.x", "levelname": "WARNING", "msg": "slot %d lost", "args": (3,), "slot": 3}
    )
    line = json.loads(JsonFormatter().format(record))
    assert (line["msg"], line["level"], line["slot"]) == ("slot 3 lost", "WARNING", 3)
    assert line["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exc"]
