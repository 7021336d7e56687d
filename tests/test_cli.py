"""The `delayq` command as a user meets it: a version, readable help, one-line failures."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

import delayq
from delayq.cli import build_parser, main

ENUM_REPR = re.compile(r"<\w+\.\w+: ")  # how an Enum member repr()s: <TopicType.PULL: 'pull'>


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


PARSERS = list(_parsers(build_parser()))


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"delayq {delayq.__version__}"


def test_every_command_is_walked():
    names = {" ".join(path) for path, _ in PARSERS}
    assert {"serve", "dev", "operator", "pipeline ingest", "pipeline archive"} <= names
    assert "pipeline audit" in names


@pytest.mark.parametrize(
    ("path", "parser"), PARSERS, ids=[" ".join(p) or "delayq" for p, _ in PARSERS]
)
def test_every_option_has_help_and_no_enum_repr(path, parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or not action.option_strings:
            continue
        assert (action.help or "").strip(), f"{' '.join(path)} {action.option_strings}"
    text = parser.format_help()
    assert not ENUM_REPR.search(text), text


def test_serve_help_shows_enum_defaults_as_values():
    serve = dict(PARSERS)[("serve",)]
    text = " ".join(serve.format_help().split())
    assert "DELAYQ_TOPIC_TYPE, default pull)" in text


ARCHIVE = ["pipeline", "archive", "--topic", "t", "--slots", "1", "--output"]


def test_archive_with_unreachable_redis_is_one_line(capsys, tmp_path):
    argv = [*ARCHIVE, str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp")]
    code = main([*argv, "--redis", "redis://:hunter2@127.0.0.1:1/0"])
    assert code == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(
        "delayq pipeline archive: cannot reach Redis at redis://:***@127.0.0.1:1/0: "
    )
    assert "hunter2" not in captured.err
    assert captured.out == ""


def test_audit_with_missing_input_is_one_line(capsys, tmp_path):
    missing = tmp_path / "no-such-journal"
    assert main(["pipeline", "audit", "--input", str(missing), "--output", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"delayq pipeline audit: cannot read --input {missing}: no such file or directory"
    )
    assert captured.out == ""


def test_ingest_with_unreachable_redis_is_one_line_before_spark(capsys, tmp_path):
    source = tmp_path / "in.json"
    source.write_text('{"id": "a", "delay": 1}\n')
    argv = ["pipeline", "ingest", "--redis", "redis://127.0.0.1:1/0", "--topic", "t"]
    argv += ["--slots", "1", "--input", str(source), "--format", "json"]
    assert main([*argv, "--rejects", str(tmp_path / "rejects")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "delayq pipeline ingest: cannot reach Redis at redis://127.0.0.1:1/0"
    )
