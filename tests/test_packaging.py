"""Packaging: one version everywhere, and a missing extra is a one-line error naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

import delayq
from delayq.cli import main
from delayq.kube.builders.common import BuildContext

ROOT = Path(__file__).resolve().parents[1]


def test_chart_and_image_carry_the_package_version():
    chart = yaml.safe_load((ROOT / "charts" / "delayq" / "Chart.yaml").read_text())
    assert chart["version"] == delayq.__version__
    assert chart["appVersion"] == delayq.__version__
    assert BuildContext().image.endswith(f":{delayq.__version__}")


@pytest.mark.parametrize(
    ("argv", "module", "extra"),
    [
        (["operator"], "kopf", "operator"),
        (["pipeline", "audit", "--input", "in", "--output", "out"], "pyspark", "pipeline"),
        (
            [
                *["pipeline", "archive", "--redis", "redis://127.0.0.1:1/0", "--topic", "t"],
                *["--slots", "1", "--output", "out", "--checkpoint", "cp"],
            ],
            "pyarrow",
            "pipeline",
        ),
        (  # the ingest writer's mapInArrow: pyspark refuses it without pandas
            [
                *["pipeline", "ingest", "--redis", "redis://127.0.0.1:1/0", "--topic", "t"],
                *["--slots", "1", "--input", "in", "--format", "csv", "--rejects", "out"],
            ],
            "pandas",
            "pipeline",
        ),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(monkeypatch, capsys, argv, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # what find_spec reports for an absent module
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert module in err
    assert f"delayq[{extra}]" in err


def test_package_data_ships_every_lua_file():
    """A wheel (the image installs one) must carry every script and every include it inlines:
    the package-data globs of pyproject.toml cover each .lua file of the package."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["delayq"]
    package = ROOT / "operator" / "delayq"
    shipped = {path for pattern in globs for path in package.glob(pattern)}
    assert set(package.rglob("*.lua")) <= shipped


def test_package_data_ships_the_dashboard():
    """`delayq serve` serves /ui from the installed package (no CDN, no network): the wheel
    must carry every file of service/ui, and every file the page loads must be there."""
    import re
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["delayq"]
    package = ROOT / "operator" / "delayq"
    shipped = {path for pattern in globs for path in package.glob(pattern)}
    ui = package / "service" / "ui"
    assert {p for p in ui.iterdir() if p.is_file()} <= shipped
    page = (ui / "index.html").read_text()
    loaded = set(re.findall(r'(?:src|href)="ui/([^"]+)"', page))
    assert loaded == {"app.js", "app.css"}
    assert all((ui / name).is_file() for name in loaded)
    assert not re.search(r'(?:src|href)="(?:https?:)?//', page)  # nothing from elsewhere
