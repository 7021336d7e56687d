"""Optional dependency groups (pyproject's extras) and the one-line error when one is missing.

The core package runs `delayq serve` and `delayq dev`; `delayq operator` needs the `operator`
extra (kopf) and `delayq pipeline` the `pipeline` extra (PySpark, pyarrow, pandas). A command
checks its modules before importing them, so a missing extra is a one-line error naming the
extra instead of a traceback from deep inside a job.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence


def missing_extra(extra: str, modules: Sequence[str]) -> str | None:
    """None when every module is importable, else one line naming the extra that installs them."""
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return (
        f"{', '.join(absent)} not installed: it comes with the [{extra}] extra "
        f"(pip install 'delayq[{extra}]')"
    )
