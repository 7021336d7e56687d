"""The Lua files honour their naming and header contract (pure: reads the files)."""

from __future__ import annotations

import re

import pytest

from delayq.queue.codes import Code
from delayq.queue.scripts import INCLUDE_LINE, Script, script_header, script_source


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
    for number, name in re.findall(r"^\s+(-?\d+) ([A-Z_]+)\b", script_header(script), re.MULTILINE):
        assert Code[name] == int(number), f"{script}: {number} {name}"


@pytest.mark.parametrize("script", list(Script))
def test_includes_are_inlined(script: Script) -> None:
    source = script_source(script)
    assert not INCLUDE_LINE.search(source)
    if "now_ms()" in source:
        assert "local function now_ms()" in source
