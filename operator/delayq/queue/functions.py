"""The engine's transitions as one Redis Functions library, generated from `lua/*.lua`.

Why Functions: a user that may SCRIPT LOAD + EVALSHA can run any Lua it writes (a busy loop
blocks the broker; the script reaches every key the user may touch). With Functions, only a
user holding FUNCTION (the operator's admin user, or whoever runs a loopback redis-server of
its own) installs code; the services, pipelines and stream readers only FCALL what is there.
Functions also replicate and persist (RDB/AOF) with the data, so a failover keeps them.

Each transition's `.lua` file stays the source of truth (its KEYS/ARGV/returns header, its
`#!lua flags=...` line). The library is built from whatever files `lua/` holds, at load time:
- the helpers every script names on `--@include` lines are defined once, at the library's top
  level (each after those it needs), with the whole `codes` table: built once per load, not
  once per call as in the scripts;
- each file's body becomes `redis.register_function{function_name=..., callback=function(KEYS,
  ARGV) <body> end, flags=...}` with its shebang's flags: `allow-oom` where a transition must
  still run on a full broker (acks, claims, cancels, purges: they free memory or the delivery
  path needs them), `no-writes` for the read-only ones (called with FCALL_RO, refused nothing
  under maxmemory, runnable on a replica). A function without `allow-oom` is refused up front
  on a broker over maxmemory (a script without a shebang used to fail only at its first
  growing write);
- a `version` function answers the library's name, the readiness probe's question "is this
  broker's library the one my code calls?".

The library's name carries a hash of its source (`delayq_<hash>`) and so does every function
(`delayq_<hash>_<verb>`): pods of two versions share a broker during a rolling upgrade, each
calling its own library. A broker that lost it (restarted without persistence, FUNCTION FLUSH)
answers "Function not found": an admin client loads it again (`load`), a restricted one raises
`FunctionsMissingError` until the operator's health pass has.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import redis
import redis.asyncio

from delayq.queue.codes import DelayqError
from delayq.queue.scripts import (
    CODES_INCLUDE,
    INCLUDE_LINE,
    TRACKED_REDIS,
    WRAPPER_INCLUDES,
    Script,
    assemble,
    inline_includes,
    read_include,
)

LIBRARY_PREFIX = "delayq_"
#: A library's name as `library()` makes it: the prefix and a hash of the source, in hex.
LIBRARY_NAME = re.compile(rf"{LIBRARY_PREFIX}[0-9a-f]{{1,64}}")
VERSION_FUNCTION = "version"
#: Registered by every library whose scripts read a slot's records in buckets
#: (`lua/includes/record_buckets.lua`), from the first version that does: a topic's owner lets
#: the scripts write buckets only while every delayq library on the broker has it
#: (`reads_record_buckets`), since a library without it would not see such a record and take
#: its message for absent.
RECORD_BUCKETS_FUNCTION = "record_buckets"
#: The same for a slot's waiting messages in buckets (`lua/includes/store_buckets.lua`):
#: `reads_store_buckets`.
STORE_BUCKETS_FUNCTION = "store_buckets"
SHEBANG = re.compile(r"\A#!lua(?: flags=([\w,-]*))?\n")
#: Redis's answer to an FCALL of a function it does not have.
NOT_FOUND_TEXT = "Function not found"
#: Redis's answer to a FUNCTION DELETE of a library it does not have.
_NO_LIBRARY_TEXT = "Library not found"
_ALREADY_EXISTS_TEXT = "already exists"


class FunctionsMissingError(DelayqError, redis.ResponseError):
    """The broker lacks this version's functions library and this client may not load it (a
    restricted user): the operator loads it on its next health pass when it runs this version
    (it loads its own version's only, kube/libraries.py). Nothing ran.

    Still a redis-py `ResponseError`, so every loop that rides out a failing Redis (the
    consumers' claims, the API's 503 with Retry-After) rides this out too, without a
    traceback."""


@dataclass(frozen=True)
class Library:
    """The generated library: its name (`delayq_<hash>`), its source for FUNCTION LOAD and
    the read-only transitions (FCALL_RO)."""

    name: str
    source: str
    read_only: frozenset[str]

    def function(self, script: Script) -> str:
        return f"{self.name}_{script.verb}"

    def command(self, script: Script) -> str:
        return "FCALL_RO" if script.verb in self.read_only else "FCALL"

    @property
    def version_function(self) -> str:
        return f"{self.name}_{VERSION_FUNCTION}"


def split_shebang(text: str) -> tuple[list[str], str]:
    """A script's `#!lua flags=a,b` flags and its text without that line."""
    match = SHEBANG.match(text)
    if match is None:
        return [], text
    return [flag for flag in (match[1] or "").split(",") if flag], text[match.end() :]


#: The Lua and Redis globals the library's code may use. In a function every global is looked
#: up through a metatable (Redis 7's functions run with an empty global table whose `__index`
#: is the real one), which made global-heavy transitions (schedule) ~15% slower in Redis than
#: as EVAL scripts; the library binds the ones its code names to top-level locals on its first
#: call (they are not reachable while the library loads), so each use is an upvalue.
GLOBALS = (
    "redis",
    "tonumber",
    "tostring",
    "type",
    "string",
    "table",
    "math",
    "unpack",
    "pairs",
    "ipairs",
    "next",
    "select",
    "error",
    "assert",
    "pcall",
    "cjson",
    "cmsgpack",
    "bit",
)


def _bound_globals(code: str) -> str:
    """The library's opening: `register` (the load-time API), the locals standing for the
    globals `code` names, and `bind_globals`, which fills them at run time."""
    names = [name for name in GLOBALS if re.search(rf"\b{name}\b", code)]
    if "redis" not in names:
        names.insert(0, "redis")
    listed = ", ".join(names)
    fetched = ", ".join(f"g.{name}" for name in names)
    return (
        "local register = redis.register_function\n"
        f"local {listed}\n"
        f"local function bind_globals()\n  local g = _G\n  {listed} = {fetched}\nend\n\n"
    )


#: Run by the first call of any function (the globals cannot be reached while the library
#: loads): the globals as locals, then `redis` wrapped to note a doubling's changes and to find
#: the slots' records in their buckets.
_BIND = f"""
local function bind()
  bind_globals()
  {TRACKED_REDIS.removeprefix("local ")}
end
"""


def _register(function_name: str, body: str, flags: list[str]) -> str:
    """A transition's registration. Its first line after binding starts the call for the
    change-tracking wrapper, which the library's calls share: what one call learnt of its slots'
    tracking (`untracked_slots`) is never trusted by the next."""
    quoted = ", ".join(f"'{flag}'" for flag in flags)
    return (
        f"register{{function_name = '{function_name}', flags = {{{quoted}}},\n"
        "callback = function(KEYS, ARGV)\n"
        f"if redis == nil then bind() end\nredis.begin_call()\n{body.rstrip()}\nend}}\n\n"
    )


def build(files: dict[str, str]) -> Library:
    """The library of `files` (file stem `<verb>-<numKeys>` -> text as written)."""
    helpers: set[str] = set()
    bodies: list[tuple[str, str, list[str]]] = []
    for stem, text in sorted(files.items()):
        assemble(f"{stem}.lua", text, read_include)  # refuses unknown codes / includes
        flags, body = split_shebang(text)
        helpers |= set(INCLUDE_LINE.findall(body))
        verb = stem.rsplit("-", 1)[0]
        bodies.append((verb, INCLUDE_LINE.sub("", body), flags))
    # every transition's `redis` is the change-tracking wrapper (scripts.with_change_tracking),
    # so its helpers' writes are noted too: without it a doubling's catch-up misses them
    helpers |= set(WRAPPER_INCLUDES)
    wanted = "".join(f"--@include {name}\n" for name in sorted(helpers - {CODES_INCLUDE}))
    prelude = read_include(CODES_INCLUDE) or ""
    prelude += inline_includes("library", wanted, read_include).replace(prelude, "")
    prelude += _BIND
    # generated with a placeholder name, then named by the hash of all of it (the generator's
    # own output included, so a change here is a new version too)
    registered = "".join(_register(f"@_{verb}", body, flags) for verb, body, flags in bodies)
    version = _register(f"@_{VERSION_FUNCTION}", "return '@'", ["no-writes"])
    for marker in (RECORD_BUCKETS_FUNCTION, STORE_BUCKETS_FUNCTION):
        version += _register(f"@_{marker}", "return 1", ["no-writes"])
    opening = _bound_globals(prelude + "".join(body for _, body, _ in bodies))
    template = f"{opening}{prelude}\n{registered}{version}"
    name = f"{LIBRARY_PREFIX}{hashlib.sha1(template.encode()).hexdigest()[:16]}"
    source = f"#!lua name={name}\n" + template.replace("'@_", f"'{name}_").replace(
        "return '@'", f"return '{name}'"
    )
    read_only = frozenset(verb for verb, _, flags in bodies if "no-writes" in flags)
    return Library(name, source, read_only)


def _lua_files() -> dict[str, str]:
    folder = resources.files("delayq.queue") / "lua"
    return {
        path.name.removesuffix(".lua"): path.read_text()
        for path in folder.iterdir()
        if path.is_file() and path.name.endswith(".lua")
    }


@functools.cache
def library() -> Library:
    """This code's library, built once per process from the `lua/` files."""
    return build(_lua_files())


def is_missing(reply: object) -> bool:
    """`reply` is Redis refusing an FCALL of a function it does not have (nothing ran)."""
    return isinstance(reply, redis.ResponseError) and NOT_FOUND_TEXT in str(reply)


def missing_error(error: Exception) -> FunctionsMissingError:
    typed = FunctionsMissingError(
        f"the broker has no delayq functions library {library().name} and this user may not "
        "load it (the operator's health pass loads its own version's: a client of another "
        f"version fails until it runs the operator's): {error}"
    )
    typed.__cause__ = error
    return typed


def _loaded(reply_or_error: object) -> bool:
    if isinstance(reply_or_error, redis.exceptions.NoPermissionError):
        raise missing_error(reply_or_error)
    if isinstance(reply_or_error, redis.ResponseError):
        if _ALREADY_EXISTS_TEXT in str(reply_or_error):
            return False  # another client loaded it first
        raise reply_or_error
    return True


def load(client: redis.Redis) -> bool:
    """FUNCTION LOAD this library (admin rights); False when the broker has it already.
    FunctionsMissingError when the user may not load functions."""
    try:
        return _loaded(client.function_load(library().source))
    except redis.ResponseError as error:
        return _loaded(error)


async def load_async(client: redis.asyncio.Redis) -> bool:
    """As `load`, for an asyncio client."""
    try:
        return _loaded(await client.function_load(library().source))
    except redis.ResponseError as error:
        return _loaded(error)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: The functions' memory (INFO `used_memory_functions`) up to which a broker's libraries are
#: listed: this library is ~120 kB of it, a few versions at once during an upgrade.
MAX_LISTED_FUNCTIONS_BYTES = 16 * 1024 * 1024


class FunctionsTooLargeError(redis.RedisError):
    """The broker holds more functions than delayq ever loads: its libraries are not listed.
    FUNCTION LIST answers every function's name and description, and whoever holds a broker's
    admin login (a topic's Secret has it) may load any: the operator would read them whole."""


def _listed(reply: object) -> dict[str, set[str]]:
    """FUNCTION LIST's reply as library name -> the names of its functions."""
    listed: dict[str, set[str]] = {}
    for entry in cast("list[Any]", reply or []):
        fields = _as_map(entry)
        names = {_text(_as_map(function).get("name", "")) for function in fields["functions"]}
        listed[_text(fields["library_name"])] = names
    return listed


def _as_map(entry: Any) -> dict[str, Any]:
    """A map of FUNCTION LIST's reply: RESP2 writes [key, value, ...], RESP3 a map."""
    if not isinstance(entry, dict):
        entry = dict(zip(entry[::2], entry[1::2], strict=True))
    return {_text(key): value for key, value in entry.items()}


def _checked_size(memory: Mapping[str, Any]) -> None:
    used = int(memory.get("used_memory_functions", 0))
    if used > MAX_LISTED_FUNCTIONS_BYTES:
        raise FunctionsTooLargeError(
            f"used_memory_functions is {used} bytes, over the {MAX_LISTED_FUNCTIONS_BYTES} "
            "delayq's libraries ever take: not listed"
        )


def listed(client: redis.Redis) -> dict[str, set[str]]:
    """Every delayq library the broker holds, of any version, with its functions' names
    (FUNCTION LIST: admin rights); FunctionsTooLargeError, unread, over
    MAX_LISTED_FUNCTIONS_BYTES."""
    _checked_size(client.info("memory"))
    return _listed(client.function_list(library=f"{LIBRARY_PREFIX}*"))


async def listed_async(client: redis.asyncio.Redis) -> dict[str, set[str]]:
    """As `listed`."""
    _checked_size(await client.info("memory"))
    return _listed(await client.function_list(library=f"{LIBRARY_PREFIX}*"))


async def loaded_async(client: redis.asyncio.Redis) -> list[str]:
    """The names of every delayq library the broker holds, of any version (`listed_async`)."""
    return list(await listed_async(client))


def reads_record_buckets(libraries: Mapping[str, set[str]]) -> bool:
    """Whether every library listed (`listed`) reads records in buckets: each has its
    RECORD_BUCKETS_FUNCTION. A broker with none is no exception: the caller loads this one."""
    return _all_have(libraries, RECORD_BUCKETS_FUNCTION)


def reads_store_buckets(libraries: Mapping[str, set[str]]) -> bool:
    """Whether every library listed reads waiting messages in buckets (STORE_BUCKETS_FUNCTION),
    as `reads_record_buckets`."""
    return _all_have(libraries, STORE_BUCKETS_FUNCTION)


def _all_have(libraries: Mapping[str, set[str]], marker: str) -> bool:
    return all(f"{name}_{marker}" in names for name, names in libraries.items())


async def delete_async(client: redis.asyncio.Redis, name: str) -> None:
    """FUNCTION DELETE the library `name` (admin rights); one already gone is no error."""
    try:
        await client.function_delete(name)
    except redis.ResponseError as error:
        if _NO_LIBRARY_TEXT not in str(error):
            raise


async def ensure_async(client: redis.asyncio.Redis) -> bool:
    """Make sure the broker has this library: FCALL_RO of its `version` function (read-only,
    so it is not held by a CLIENT PAUSE WRITE), then a load only when it is missing. True when
    it was loaded now. FunctionsMissingError when it is missing and this user may not load it;
    Redis and network errors are raised."""
    try:
        await client.fcall_ro(library().version_function, 0)
        return False
    except redis.ResponseError as error:
        if not is_missing(error):
            raise
    return await load_async(client)
