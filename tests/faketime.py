"""Run a process with its wall clock skewed by libfaketime (Debian `faketime`, installed by
scripts/setup.sh); its monotonic clock stays real. Shared by the clock-skew test and the chaos
suite."""

from __future__ import annotations

import os
from glob import glob
from pathlib import Path

# its sitecustomize works around libfaketime 0.9.10 breaking Python's time.sleep when the
# monotonic clock is left real (kazoo's reconnect thread died of it)
SKEWED_SITE = Path(__file__).parent / "chaos" / "skewed_site"


def faketime_library() -> str | None:
    """The libfaketime shared object, if installed."""
    found = sorted(glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def faketime_env(skew_s: float) -> dict[str, str]:
    """Environment that shifts a process's wall clock by `skew_s` (nothing for 0)."""
    if not skew_s:
        return {}
    library = faketime_library()
    if library is None:
        raise FileNotFoundError("libfaketime not found: run scripts/setup.sh (Debian faketime)")
    path = os.pathsep.join(p for p in (str(SKEWED_SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "LD_PRELOAD": library,
        "FAKETIME": f"{skew_s:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
