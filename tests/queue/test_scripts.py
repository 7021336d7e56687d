"""The Lua files honour their naming, header and include contract (pure: reads the files)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from delayq.queue.codes import Code
from delayq.queue.scripts import (
    CODES_INCLUDE,
    INCLUDE_LINE,
    TRACKED_REDIS,
    WRAPPER_INCLUDES,
    Script,
    ScriptSourceError,
    assemble,
    inline_includes,
    lua_code_table,
    read_include,
    script_file,
    script_header,
    script_source,
)

INCLUDES_DIR = resources.files("delayq.queue") / "lua" / "includes"
LUA_FILES = resources.files("delayq.queue") / "lua"
HELPERS = sorted(
    [p.name.removesuffix(".lua") for p in INCLUDES_DIR.iterdir() if p.name.endswith(".lua")]
    + [CODES_INCLUDE]
)
#: The parts a doubling divides member by member (queue/slot_split.py) and the only commands
#: the scripts change them with, which track_changes.lua notes; the other writes go to the
#: per-slot parts, which the doubling copies whole under its freeze.
TRACKED_WRITES = {"ZADD", "ZREM", "HSET", "HDEL"}
PER_SLOT_WRITES = {
    ("SET", "KEYS[1]"),  # epoch: freeze, thaw
    ("SET", "epoch_key"),  # epoch: fence
    ("DEL", "KEYS[1]"),  # epoch: thaw
    ("INCR", "leases_key"),
    ("RPUSH", "wake"),
    ("DEL", "wake"),  # wake_at.lua: the list's later element replaced by an earlier one
    ("XADD", "key"),  # journal.lua
    ("SADD", "changes"),  # track_changes.lua itself
    # a bucket rewritten as it splits (bucketed_part.lua), below the tracking: the entries
    # stay in their slot and a doubling's scan sees them (queue/record_buckets.py)
    ("DEL", "bucket"),
    ("DEL", "meta"),  # the slot's `buckets` hash, dropped with its last bucket
    ("DEL", "settings"),  # the settings record (publish-1): not a part, never divided
    ("PEXPIRE", "key"),  # pace, hold: the topic's pace, outside every slot
}
DEFINITION = re.compile(r"^local (?:function )?(\w+)\b", re.MULTILINE)


def code_of(text: str) -> str:
    """Lua text without comments and string literals: what remains is what the code uses."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.DOTALL)
    text = re.sub(r"--[^\n]*", "", text)
    return re.sub(r"'[^'\n]*'", "''", text)


def defined_name(helper: str) -> str:
    text = read_include(helper)
    assert text is not None, helper
    names = DEFINITION.findall(code_of(text))
    assert len(names) == 1, f"{helper}: one helper per include file, found {names}"
    return names[0]


def listed_includes(text: str) -> list[str]:
    return INCLUDE_LINE.findall(text)


def used_helpers(text: str, itself: str | None = None) -> set[str]:
    code = code_of(text)
    return {
        helper
        for helper in HELPERS
        if helper != itself and re.search(rf"\b{defined_name(helper)}\b", code)
    }


def header_codes(script: Script) -> set[str]:
    return {name for _, name in re.findall(r"(-?\d+) ([A-Z][A-Z_]+)\b", script_header(script))}


@pytest.mark.parametrize("script", list(Script))
def test_header_lists_exactly_num_keys_keys(script: Script) -> None:
    header = script_header(script)
    keys = sorted(int(n) for n in re.findall(r"KEYS\[(\d+)\]", header))
    assert keys == list(range(1, script.num_keys + 1)), header
    assert "ARGV" in header
    assert "Returns" in header
    assert "Events:" in header


@pytest.mark.parametrize("script", list(Script))
def test_every_return_code_named_in_a_header_exists(script: Script) -> None:
    for number, name in re.findall(r"(-?\d+) ([A-Z][A-Z_]+)\b", script_header(script)):
        assert Code[name] == int(number), f"{script}: {number} {name}"


@pytest.mark.parametrize("script", list(Script))
def test_a_script_returns_by_name_exactly_the_codes_its_header_lists(script: Script) -> None:
    """The codes of its helpers too: schedule-10 returns schedule_slot's, which the one-slot
    and the several-slot calls share."""
    used = set(re.findall(r"\bCODE\.(\w+)", code_of(script_source(script))))
    assert used == header_codes(script)


@pytest.mark.parametrize("script", list(Script))
def test_includes_are_inlined_after_the_header(script: Script) -> None:
    text, source = script_file(script), script_source(script)
    assert not INCLUDE_LINE.search(source)
    assert source.startswith(script_header(script))  # `#!lua flags=...` stays the first line
    assert all(m.start() > len(script_header(script)) for m in INCLUDE_LINE.finditer(text))


@pytest.mark.parametrize("script", list(Script))
def test_a_script_lists_exactly_the_helpers_it_uses(script: Script) -> None:
    listed = listed_includes(script_file(script))
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == used_helpers(script_file(script)), script


@pytest.mark.parametrize("helper", HELPERS)
def test_a_helper_lists_exactly_the_helpers_it_uses(helper: str) -> None:
    text = read_include(helper)
    assert text is not None
    named = "code" if helper == CODES_INCLUDE else helper  # codes defines the table CODE
    assert defined_name(helper).lower() == named  # one helper per file, named after it
    assert set(listed_includes(text)) == used_helpers(text, itself=helper)


@pytest.mark.parametrize("script", list(Script))
def test_each_helper_is_inlined_once_after_those_it_uses(script: Script) -> None:
    source = code_of(script_source(script))
    positions = {}
    for helper in HELPERS:
        definitions = re.findall(rf"^local (?:function )?{defined_name(helper)}\b", source, re.M)
        assert len(definitions) <= 1, helper
        if definitions:
            positions[helper] = source.index(definitions[0])
    for helper, at in positions.items():
        text = read_include(helper)
        assert text is not None
        assert all(positions[dep] < at for dep in listed_includes(text)), helper
    assert set(positions) >= used_helpers(script_file(script))


@pytest.mark.parametrize("script", list(Script))
def test_every_script_writes_through_the_change_tracking_before_any_helper(
    script: Script,
) -> None:
    source = code_of(script_source(script))
    shadow = source.index(TRACKED_REDIS)
    for helper in HELPERS:
        found = re.search(rf"^local (?:function )?{defined_name(helper)}\b", source, re.M)
        # it and its own
        wrappers = {*WRAPPER_INCLUDES, "bucketed_part", "settings_record", "bucket_groups"}
        wrappers |= {"bucket_of", "id_hash", "compacted_record", "expanded_record"}
        wrappers |= {"now_ms", "now_us"}  # store_buckets's clock: TIME, no write
        if found and helper not in wrappers | {"existing_count", "unpack_chunk"}:
            assert found.start() > shadow, helper


def test_scripts_change_the_divided_parts_only_with_the_tracked_commands() -> None:
    """A write command that track_changes.lua does not note would change a slot behind a
    doubling's copy: every write is one of the tracked four, or goes to a per-slot part."""
    reads = {"GET", "MGET", "EXISTS", "LRANGE", "HGET", "HMGET", "HLEN", "HGETALL", "ZCARD"}
    reads |= {"ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZSCORE", "ZMSCORE", "TIME", "PTTL"}
    reads |= {"ZRANGEBYLEX", "ZLEXCOUNT"}
    root = Path(str(resources.files("delayq.queue") / "lua"))
    for path in sorted(root.glob("*.lua")) + sorted((root / "includes").glob("*.lua")):
        code = re.sub(r"--[^\n]*", "", re.sub(r"--\[\[.*?\]\]", "", path.read_text(), flags=re.S))
        calls = re.findall(r"redis\.p?call\('([A-Z]+)',?\s*([\w\[\]]*)", code)
        calls += [(command, "") for command in re.findall(r"_chunked\('([A-Z]+)'", code)]
        for command, key in calls:
            allowed = command in reads | TRACKED_WRITES or (command, key) in PER_SLOT_WRITES
            assert allowed, (path.name, command, key)


def test_the_code_table_is_generated_from_the_enum() -> None:
    table = dict(re.findall(r"^\s+([A-Z_]+) = (-?\d+),$", lua_code_table(), re.MULTILINE))
    assert {name: int(value) for name, value in table.items()} == {c.name: c.value for c in Code}
    assert not (INCLUDES_DIR / f"{CODES_INCLUDE}.lua").is_file()  # never a file that can drift


def test_the_inliner_resolves_includes_recursively_once_in_dependency_order() -> None:
    files = {
        "a": "--@include b\n--@include c\nA\n",
        "b": "--@include c\nB\n",
        "c": "C\n",
    }
    source = inline_includes("s.lua", "HEAD\n--@include a\n--@include c\nBODY\n", files.get)
    assert source == "HEAD\nC\n\nB\n\nA\n\nBODY\n"


def test_the_inliner_names_a_cycle() -> None:
    files = {"a": "--@include b\nA\n", "b": "--@include a\nB\n"}
    with pytest.raises(ScriptSourceError, match=r"s\.lua: include cycle: a -> b -> a"):
        inline_includes("s.lua", "--@include a\n", files.get)


def test_the_inliner_names_a_missing_include_and_who_wants_it() -> None:
    files = {"a": "--@include gone\nA\n"}
    with pytest.raises(ScriptSourceError, match=r"--@include gone in includes/a\.lua"):
        inline_includes("s.lua", "--@include a\n", files.get)
    with pytest.raises(ScriptSourceError, match=r"--@include nope in s\.lua"):
        inline_includes("s.lua", "--@include nope\n", files.get)


@pytest.mark.parametrize("script", list(Script))
def test_a_loaded_script_builds_a_table_of_just_the_codes_it_returns(script: Script) -> None:
    source = script_source(script)
    tables = re.findall(r"^local CODE = \{\n(.*?)^\}$", source, re.MULTILINE | re.DOTALL)
    used = set(re.findall(r"\bCODE\.(\w+)", source))
    assert len(tables) == (1 if used else 0)
    if used:
        entries = dict(re.findall(r"^\s+([A-Z_]+) = (-?\d+),$", tables[0], re.MULTILINE))
        assert {name: int(value) for name, value in entries.items()} == {n: Code[n] for n in used}


def test_assembling_refuses_an_unknown_code_or_a_missing_code_table() -> None:
    codes = {CODES_INCLUDE: lua_code_table()}
    with pytest.raises(ScriptSourceError, match=r"s\.lua: not a .*Code: \['ACKD'\]"):
        assemble("s.lua", "--@include codes\nreturn CODE.ACKD\n", codes.get)
    with pytest.raises(ScriptSourceError, match=r"s\.lua: uses CODE without --@include codes"):
        assemble("s.lua", "return CODE.ACKED\n", codes.get)
    assert assemble("s.lua", "--@include codes\nreturn CODE.ACKED\n", codes.get).endswith(
        "local CODE = {\n  ACKED = 7,\n}\n\nreturn CODE.ACKED\n"
    )
