"""The releases the upgrade test starts from: releases.yaml read once, for the tests and for
``e2e/images.sh`` (``python3 e2e/harness/releases.py previous`` prints ``<version> <commit>``).

The previous release is the last one with a commit that is not the version the working tree
carries; its chart is taken from that commit with ``git archive`` (git tags may not travel with
a clone of main, the commit does).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parents[2]


class Release(NamedTuple):
    version: str
    commit: str


def previous_release() -> Release:
    """The release before the working tree's version (the newest one cut, if the working tree
    carries an unreleased version)."""
    releases = yaml.safe_load((REPO / "releases.yaml").read_text())["releases"]
    current = str(releases[-1]["version"])
    cut = [Release(str(r["version"]), str(r["commit"])) for r in releases
           if r["commit"] and str(r["version"]) != current]
    if not cut:
        raise LookupError("releases.yaml names no release before the working tree's")
    return cut[-1]


def extract_chart(release: Release, destination: Path) -> Path:
    """charts/delayq as ``release`` shipped it, written under ``destination``; its path."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", release.commit, "charts/delayq"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    return destination / "charts" / "delayq"


if __name__ == "__main__" and sys.argv[1:] == ["previous"]:
    print(*previous_release())
