"""The test tools the project builds itself (scripts/install-*.sh: helm, MinIO, the S3A jars),
cached in ~/.cache/delayq-tools; scripts/test.sh builds them before the tests tier, so a test
that asks here only reads the cache (or builds it once, outside CI)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def installed(script: str) -> str:
    """What ``scripts/<script>.sh`` prints last: the installed tool's path (the jars' list)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / f"{script}.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]
