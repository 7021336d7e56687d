"""W3C Trace Context carried by a message (pure): the reserved headers `traceparent` and
`tracestate`, checked when a message is scheduled.

A producer's trace context rides with its message as two ordinary headers, so every delivery
(webhook body, pull lease answer, stream entry) hands it on unchanged, with no change to the
stored record: nothing when absent, the 55-byte `traceparent` (and the `tracestate`, at most
512 bytes) when given. They are checked here rather than at delivery: a malformed value
stored for a year would break a receiver's propagator then, far from the producer's mistake.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACESTATE_BYTES = 512  # W3C Trace Context: a vendor may drop a longer one

# version 00 (a later version may append fields after a dash), trace id, parent id, flags;
# lowercase hex only (W3C), version ff invalid. The patterns are Python's and Java's (the
# pipeline's Spark validation matches them too).
TRACEPARENT_PATTERN = (
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-[ -~]*)?"
)
# list members `key=value` separated by commas (optional blanks): the W3C grammar's characters.
# Each run of blanks has one place in the pattern (an empty member's blanks are the ones after
# its comma): with two (`,[ \t]*(member)?[ \t]*`) a backtracking engine, Python's and Java's,
# tried every split of every run, and 100 bytes of `,        ` held a process for minutes.
_MEMBER = r"[a-z0-9_\-*/@]+=[!-+\--<>-~]*"
TRACESTATE_PATTERN = rf"[ \t]*{_MEMBER}[ \t]*(,[ \t]*({_MEMBER}[ \t]*)?)*"
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
_TRACESTATE = re.compile(TRACESTATE_PATTERN)
TRACEPARENT_RULE = (
    "a W3C traceparent: version-traceid-parentid-flags in lowercase hex, "
    "e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)


def trace_context_error(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """(the header, why) when the headers' trace context is malformed, else None."""
    traceparent = headers.get(TRACEPARENT)
    tracestate = headers.get(TRACESTATE)
    if traceparent is not None and not _TRACEPARENT.fullmatch(traceparent):
        return TRACEPARENT, f"{traceparent[:80]!r} is not {TRACEPARENT_RULE}"
    if tracestate is None:
        return None
    if traceparent is None:
        return TRACESTATE, "a tracestate needs a traceparent beside it"
    if len(tracestate) > MAX_TRACESTATE_BYTES:
        return TRACESTATE, f"longer than {MAX_TRACESTATE_BYTES} bytes"
    if tracestate and not _TRACESTATE.fullmatch(tracestate):
        return TRACESTATE, f"{tracestate[:80]!r} is not a W3C tracestate (key=value,...)"
    return None
