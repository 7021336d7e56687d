"""Packaging: one version everywhere, a missing extra is a one-line error naming it, and the
images (the main one and the pipeline's) install exactly the hashed locks of what
pyproject.toml declares."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import delayq
from delayq.cli import main
from delayq.kube.builders.common import BuildContext

ROOT = Path(__file__).resolve().parents[1]


def _releases() -> list[dict[str, Any]]:
    return list(yaml.safe_load((ROOT / "releases.yaml").read_text())["releases"])


def test_chart_image_and_cli_carry_the_version_releases_yaml_ends_with():
    current = str(_releases()[-1]["version"])
    chart = yaml.safe_load((ROOT / "charts" / "delayq" / "Chart.yaml").read_text())
    assert delayq.__version__ == current
    assert chart["version"] == current
    assert chart["appVersion"] == current
    assert BuildContext().image.endswith(f":{current}")
    printed = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.stdout.strip() == f"delayq {current}"


def test_releases_yaml_names_each_release_with_its_commit_and_changelog_date():
    """Released versions rise, each names a full commit (an ancestor of HEAD when the history is
    here) and the date of its CHANGELOG section; only the last may be unreleased, and then the
    CHANGELOG has an Unreleased section for it."""
    releases = _releases()
    versions = [Version(str(release["version"])) for release in releases]
    assert versions == sorted(set(versions)), "versions must rise, each once"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for release in releases[:-1]:
        assert release["commit"] is not None, f"{release['version']} is not the last: cut it"
    for release in releases:
        version, commit, date = str(release["version"]), release["commit"], release["date"]
        if commit is None:
            assert date is None
            assert "## [Unreleased]" in changelog
            continue
        assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{version}: a full commit hash"
        assert f"## [{version}] - {date}" in changelog
        if (ROOT / ".git").exists() and not _shallow():
            ancestor = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor",
                                       commit, "HEAD"])  # fmt: skip
            assert ancestor.returncode == 0, f"{version}'s commit {commit} is not in HEAD's history"


def _shallow() -> bool:
    answer = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    )
    return answer.returncode != 0 or answer.stdout.strip() != "false"


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
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["delayq"]
    package = ROOT / "operator" / "delayq"
    shipped = {path for pattern in globs for path in package.glob(pattern)}
    assert set(package.rglob("*.lua")) <= shipped


def test_package_data_ships_the_dashboard():
    """`delayq serve` serves /ui from the installed package (no CDN, no network): the wheel
    must carry every file of service/ui, and every file the page loads must be there."""
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


LOCK = ROOT / "requirements" / "image.txt"
PIPELINE_LOCK = ROOT / "requirements" / "pipeline.txt"
BUILD_LOCK = ROOT / "requirements" / "build.txt"  # the pipeline image's build backend
DOCKERFILES = [ROOT / "Dockerfile", ROOT / "examples" / "pipeline" / "Dockerfile"]
SBOM_PATH = "/usr/share/doc/delayq/sbom.cdx.json"  # in the image (docs/security.md)
# The environment the lock is resolved for (scripts/lock.sh): the image's Python on Linux.
IMAGE_MARKER_ENV = {"python_version": "3.11", "python_full_version": "3.11.0",
                    "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}


def locked_pins(lock: Path) -> dict[str, Version]:
    """{canonical name: version} of a hashed lock file; every pin must carry a hash (pip's
    --require-hashes refuses the whole file otherwise, so a hand-added line fails here first)."""
    pins: dict[str, Version] = {}
    for block in re.split(r"\n(?=\S)", lock.read_text()):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match is None:
            continue
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{match[1]} has no hash"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def image_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """What an image installs, as pyproject.toml declares it: the core dependencies, its
    extras and the build backend (the images build delayq without build isolation)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = [
        *project["project"]["dependencies"],
        *(line for extra in extras for line in project["project"]["optional-dependencies"][extra]),
        *project["build-system"]["requires"],
    ]
    requirements = [Requirement(line) for line in declared]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(IMAGE_MARKER_ENV)]


@pytest.mark.parametrize(
    ("extras", "locks"),
    [(("operator", "tracing"), [LOCK]), (("pipeline",), [PIPELINE_LOCK, BUILD_LOCK])],
)
def test_the_image_lock_covers_every_declared_dependency_within_its_range(extras, locks):
    """The locks and pyproject.toml cannot drift apart: each dependency an image needs is
    pinned, with a hash, at a version its declared range admits (a tightened range or a new
    dependency fails here until scripts/lock.sh is run)."""
    pins = {name: pin for lock in locks for name, pin in locked_pins(lock).items()}
    names = "+".join(lock.name for lock in locks)
    for requirement in image_requirements(extras):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {names}: run scripts/lock.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{names} pins {name}=={pins[name]}, outside {requirement}: run scripts/lock.sh"
        )


def test_both_images_build_with_one_build_backend():
    """build.txt (the pipeline image's) is compiled against image.txt: the same pin."""
    assert locked_pins(BUILD_LOCK).items() <= locked_pins(LOCK).items()


def test_the_sbom_lists_every_locked_package():
    """The SBOM generator the image build runs reads the lock as it is written (hashes and
    all): its CycloneDX document names every pinned package at its pinned version. (Schema
    validation, 2.5 s of CPU, is left to the image build, which runs with it.)"""
    result = subprocess.run(
        [sys.executable, "-m", "cyclonedx_py", "requirements", "--no-validate",
         "--output-reproducible", "--output-format", "JSON", "--output-file", "-", str(LOCK)],
        capture_output=True, text=True, check=True, timeout=120,
    )
    bom = json.loads(result.stdout)
    assert bom["bomFormat"] == "CycloneDX"
    listed = {
        canonicalize_name(component["name"]): Version(component["version"])
        for component in bom["components"]
    }
    assert listed == locked_pins(LOCK)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.parent.name)
def test_the_dockerfile_installs_only_from_the_locks(dockerfile):
    """Every `pip install` of an image build is hash-checked from a lock, or the project
    itself without dependencies: nothing reaches the resolver. Wheels only, but for a package
    named by --no-binary (pyspark has no wheel), built from its hashed sdist by the locked
    build backend already installed (--no-build-isolation: no unpinned one is fetched)."""
    lines = dockerfile.read_text().splitlines(keepends=True)
    script = "".join(line for line in lines if not line.startswith("#")).replace("\\\n", " ")
    installs = re.findall(r"pip install ([^&;]*)", script)
    assert installs
    installed: set[str] = set()  # by the installs before
    for arguments in installs:
        locked = "--require-hashes" in arguments and "-r requirements/" in arguments
        assert "--no-deps" in arguments, arguments
        assert locked or arguments.split()[-1] == ".", arguments
        assert not locked or "--only-binary=:all:" in arguments, arguments
        if "--no-binary" in arguments or not locked:  # builds: with the locked backend
            assert "--no-build-isolation" in arguments, arguments
            assert "setuptools" in installed, arguments
        for lock in re.findall(r"-r (\S+)", arguments):  # each a file of the repository
            assert (ROOT / lock).is_file(), lock
            installed |= set(locked_pins(ROOT / lock))


def test_the_image_carries_the_sbom_of_its_environment():
    """The build stage writes the SBOM from the installed venv (what ships, delayq included,
    not what was asked for) and the final stage keeps it at the documented path."""
    build, final = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").split("\nFROM ")[1:]
    generate = rf"cyclonedx-py environment .*--output-file {SBOM_PATH} /opt/delayq/bin/python"
    assert re.search(generate, build)
    assert f"COPY --from=build {SBOM_PATH} {SBOM_PATH}" in final


def test_the_pipeline_image_carries_the_sbom_of_its_environment():
    """The pipeline image (one stage) writes its SBOM the same way, from its installed venv,
    and drops the generator in the layer that ran it."""
    script = (ROOT / "examples" / "pipeline" / "Dockerfile").read_text().replace("\\\n", " ")
    generate = rf"cyclonedx-py environment .*--output-file {SBOM_PATH} /opt/delayq/bin/python"
    [run] = [line for line in script.splitlines() if re.search(generate, line)]
    assert "rm -rf /opt/sbom" in run
