"""The Lua transitions: one file per transition in `lua/`, named `<verb>-<numKeys>.lua`.

Shared helpers live one per file in `lua/includes/<name>.lua`, as BullMQ keeps them. A script
(or a helper) names each helper it uses on an `--@include <name>` line after its header comment;
loading inlines the helpers recursively, each once per script and after the helpers it needs, so
every transition still runs as one atomic script. The `codes` include is not a file: it is
generated from the `Code` enum (`lua_code_table`), so the Lua return codes can never drift from
the Python ones, and holds only the codes the script returns (`CODE.ACKED`).

Assembly happens once per process (`script_source` is cached). Per call a script pays for the
Lua locals its includes define (a closure per helper, one small code table) and nothing else.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterable
from importlib import resources

from delayq.queue.codes import Code

INCLUDE_LINE = re.compile(r"^--@include (\w+)$", re.MULTILINE)
_INCLUDE_WITH_NEWLINE = re.compile(r"^--@include (\w+)(?:\n|$)", re.MULTILINE)
CODES_INCLUDE = "codes"
CODE_REFERENCE = re.compile(r"\bCODE\.(\w+)")


class ScriptSourceError(LookupError):
    """A script cannot be assembled: a missing include, an include cycle or an unknown code."""


class Script(enum.StrEnum):
    """Every transition, valued by its file stem."""

    SCHEDULE = "schedule-10"
    SCHEDULE_MANY = "schedulemany-1"  # 1 key per slot (its store), several slots of one broker
    CANCEL = "cancel-13"
    RESCHEDULE = "reschedule-7"
    CLAIM = "claim-13"
    CLAIM_MANY = "claimmany-1"  # 1 key per slot (its store), several slots of one broker
    ACK = "ack-7"
    ACK_MANY = "ackmany-1"  # 1 key per slot (its store), several slots of one broker
    NACK = "nack-11"
    EXTEND = "extend-3"
    FENCE = "fence-10"
    FREEZE = "freeze-1"
    THAW = "thaw-1"
    GIVEBACK = "giveback-6"
    REDRIVE = "redrive-7"
    PURGE = "purge-8"
    GET = "get-7"
    STATS = "stats-3"
    DEAD_PAGE = "deadpage-3"
    DEFINE = "define-9"
    DROP = "drop-7"
    TOPUP = "topup-7"
    SCHEDULES = "schedules-4"
    OVERVIEW = "overview-4"  # 4 keys per slot, any number of slots
    PUBLISH = "publish-1"  # the topic's settings into a slot's record (its owner only)
    SETTINGS = "settings-1"  # a slot's settings record, read
    PACE = "pace-1"
    HOLD = "hold-1"
    RESUME = "resume-1"  # a pause undone by its holder only (Queue.resume_as)
    RESTORE = "restore-13"  # a backup's items into one slot, create-only

    @property
    def acknowledges_a_write(self) -> bool:
        """Its answer tells the caller a change is made for good (scheduled, cancelled, acked,
        ...): on a topic with `redis_sync_replicas` the answer waits until replicas have it. Claims,
        extends, give-backs and fences do not wait: losing one in a failover only redelivers
        (at least once) or raises the epoch again, and they sit on the delivery path."""
        return self in _ACKNOWLEDGED_WRITES

    @property
    def verb(self) -> str:
        return self.value.rsplit("-", 1)[0]

    @property
    def num_keys(self) -> int:
        return int(self.value.rsplit("-", 1)[1])


_ACKNOWLEDGED_WRITES = frozenset(
    {
        Script.SCHEDULE,
        Script.SCHEDULE_MANY,
        Script.CANCEL,
        Script.RESCHEDULE,
        Script.ACK,
        Script.ACK_MANY,
        Script.NACK,
        Script.REDRIVE,
        Script.PURGE,
        Script.DEFINE,
        Script.DROP,
        Script.RESTORE,
        Script.THAW,  # a slot's copy on its new broker: the source is cleaned after it
    }
)


def lua_code_table(names: Iterable[str] | None = None) -> str:
    """The `codes` include: `local CODE = {OK = 0, ...}`, from the `Code` enum.

    With `names`, only those members (in enum order): a script builds its table on every call,
    so it carries just the codes it returns.
    """
    wanted = set(Code.__members__) if names is None else set(names)
    entries = "".join(f"  {code.name} = {code.value},\n" for code in Code if code.name in wanted)
    return (
        "-- Return codes, generated from delayq.queue.codes.Code at load time (never edit here).\n"
        f"local CODE = {{\n{entries}}}\n"
    )


def inline_includes(origin: str, text: str, read_include: Callable[[str], str | None]) -> str:
    """`text` with each `--@include` line replaced by that helper and the helpers it includes.

    Every helper appears once, after those it includes (a later line naming one already inlined
    becomes empty). `read_include` returns a helper's text, or None when there is no such helper;
    `origin` names the script in errors.
    """
    inlined: set[str] = set()

    def expand(name: str, chain: tuple[str, ...]) -> str:
        if name in chain:
            raise ScriptSourceError(f"{origin}: include cycle: {' -> '.join((*chain, name))}")
        if name in inlined:
            return ""
        body = read_include(name)
        if body is None:
            where = f"includes/{chain[-1]}.lua" if chain else origin
            raise ScriptSourceError(f"{origin}: --@include {name} in {where}: no such include")
        body = _INCLUDE_WITH_NEWLINE.sub(lambda m: expand(m[1], (*chain, name)), body)
        inlined.add(name)
        return re.sub(r"\n{3,}", "\n\n", body).strip("\n") + "\n\n"

    return _INCLUDE_WITH_NEWLINE.sub(lambda m: expand(m[1], ()), text)


def _lua_dir() -> resources.abc.Traversable:
    return resources.files("delayq.queue") / "lua"


def read_include(name: str) -> str | None:
    """A helper's text: `lua/includes/<name>.lua`, or the generated code table for `codes`."""
    if name == CODES_INCLUDE:
        return lua_code_table()
    path = _lua_dir() / "includes" / f"{name}.lua"
    return path.read_text() if path.is_file() else None


def script_file(script: Script) -> str:
    """The script's file as written, its include lines not inlined."""
    return (_lua_dir() / f"{script.value}.lua").read_text()


def assemble(origin: str, text: str, read_include: Callable[[str], str | None]) -> str:
    """A script's loadable source: includes inlined, its code table cut to the codes it uses."""
    source = inline_includes(origin, text, read_include)
    used = CODE_REFERENCE.findall(source)
    unknown = sorted(set(used) - set(Code.__members__))
    if unknown:
        raise ScriptSourceError(f"{origin}: not a delayq.queue.codes.Code: {unknown}")
    if used and lua_code_table() not in source:
        raise ScriptSourceError(f"{origin}: uses CODE without --@include {CODES_INCLUDE}")
    return source.replace(lua_code_table(), lua_code_table(used))


#: The helper that wraps `redis` for every script: the writes a doubling's catch-up copies
#: again are noted through it (`lua/includes/track_changes.lua`).
TRACK_CHANGES_INCLUDE = "track_changes"
#: Bound right after the header, before every other helper, so theirs go through it too. It
#: wraps the one that finds a slot's records in their buckets (`lua/includes/record_buckets.lua`),
#: so what it notes are the messages a script changed, wherever their records are kept.
RECORD_BUCKETS_INCLUDE = "record_buckets"
#: Between the two, the one that finds a slot's waiting messages in their buckets
#: (`lua/includes/store_buckets.lua`).
STORE_BUCKETS_INCLUDE = "store_buckets"
TRACKED_REDIS = (
    f"local redis = {TRACK_CHANGES_INCLUDE}("
    f"{STORE_BUCKETS_INCLUDE}({RECORD_BUCKETS_INCLUDE}(redis)))"
)
#: The wrappers' includes, innermost first.
WRAPPER_INCLUDES = (RECORD_BUCKETS_INCLUDE, STORE_BUCKETS_INCLUDE, TRACK_CHANGES_INCLUDE)


def with_change_tracking(text: str) -> str:
    """`text` with `redis` bound to the change-tracking wrapper right after its header
    comment, before every other helper."""
    end = text.index("]]") + 2
    includes = "".join(f"--@include {name}\n" for name in WRAPPER_INCLUDES)
    return f"{text[:end]}\n{includes}{TRACKED_REDIS}{text[end:]}"


@functools.cache
def script_source(script: Script) -> str:
    """The script's text as loaded into Redis (`assemble`), change tracking first."""
    return assemble(f"{script.value}.lua", with_change_tracking(script_file(script)), read_include)


def script_header(script: Script) -> str:
    """The opening comment block: the KEYS/ARGV/returns contract of the script."""
    text = script_file(script)
    return text[: text.index("]]") + 2]
