"""Run a process with its wall clock skewed; its monotonic clock stays real.

Two ways: libfaketime (Debian `faketime`, installed by scripts/setup.sh), which skews every
wall-clock read of the process, C code included (the clock-skew test, one short-lived process);
and `skewed_clock_env`, which shifts Python's `time.time`/`time.time_ns` (the chaos suite's
long-running fleet, where libfaketime stalled the skewed processes for seconds: see
`tests/chaos/skewed_clock/sitecustomize.py`)."""

from __future__ import annotations

import os
from glob import glob
from pathlib import Path

# the chaos suite's Python-level skew (DELAYQ_CHAOS_CLOCK_SKEW_S)
SKEWED_CLOCK_SITE = Path(__file__).parent / "chaos" / "skewed_clock"
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
    return {
        "PYTHONPATH": _with_site(SKEWED_SITE),
        "LD_PRELOAD": library,
        "FAKETIME": f"{skew_s:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def skewed_clock_env(skew_s: float) -> dict[str, str]:
    """Environment that shifts a Python process's `time.time` by `skew_s` (nothing for 0)."""
    if not skew_s:
        return {}
    return {"PYTHONPATH": _with_site(SKEWED_CLOCK_SITE), "DELAYQ_CHAOS_CLOCK_SKEW_S": f"{skew_s}"}


def _with_site(site: Path) -> str:
    """PYTHONPATH with `site` first, so its sitecustomize is the one Python loads."""
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
