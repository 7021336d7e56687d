"""The Lua transitions: one file per transition in `lua/`, named `<verb>-<numKeys>.lua`.

`--@include <name>` lines are replaced by `lua/includes/<name>.lua` when a script is loaded, as
BullMQ does, so shared helpers are written once and every script still runs as one atomic call.
"""

from __future__ import annotations

import enum
import functools
import re
from importlib import resources

INCLUDE_LINE = re.compile(r"^--@include (\w+)$", re.MULTILINE)


class Script(enum.StrEnum):
    """Every transition, valued by its file stem."""

    SCHEDULE = "schedule-7"
    CANCEL = "cancel-6"
    RESCHEDULE = "reschedule-6"
    CLAIM = "claim-8"
    ACK = "ack-4"
    NACK = "nack-8"
    EXTEND = "extend-3"
    FENCE = "fence-1"
    GIVEBACK = "giveback-6"
    REDRIVE = "redrive-6"
    PURGE = "purge-4"
    GET = "get-5"
    STATS = "stats-3"
    DEAD_PAGE = "deadpage-3"

    @property
    def verb(self) -> str:
        return self.value.rsplit("-", 1)[0]

    @property
    def num_keys(self) -> int:
        return int(self.value.rsplit("-", 1)[1])


def _lua_dir() -> resources.abc.Traversable:
    return resources.files("delayq.queue") / "lua"


@functools.cache
def script_source(script: Script) -> str:
    """The script's text with its includes inlined."""
    text = (_lua_dir() / f"{script.value}.lua").read_text()
    return INCLUDE_LINE.sub(lambda m: (_lua_dir() / "includes" / f"{m[1]}.lua").read_text(), text)


def script_header(script: Script) -> str:
    """The opening comment block: the KEYS/ARGV/returns contract of the script."""
    text = (_lua_dir() / f"{script.value}.lua").read_text()
    return text[: text.index("]]") + 2]
