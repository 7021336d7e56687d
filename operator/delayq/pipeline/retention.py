"""Scheduled backups in one local directory: a new directory per run, the oldest deleted.

`backup --into DIR --keep N` (the operator's CronJob, spec.backup) writes each run into
`DIR/backup-<UTC start>`; a backup is complete once Spark committed its manifest
(`manifest/_SUCCESS`, written after every item). After a run completes, the oldest complete
backups beyond N are deleted, and so is an unfinished one older than the newest complete one
(a run that crashed; one still running is newer, and the CronJob runs one at a time). A
directory is renamed out of the pattern before it is removed, so a run killed mid-delete never
leaves a half-deleted backup that still looks complete. Nothing not named by this module is
touched: the claim may hold other files.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import UTC, datetime

PREFIX = "backup-"
DELETING = "deleting-"
NAME = re.compile(r"^backup-[0-9]{8}T[0-9]{9}Z$")
COMPLETE_MARK = os.path.join("manifest", "_SUCCESS")


def backup_name(at: datetime) -> str:
    """`backup-20261129T071500123Z`: sorts in time order, as its start in UTC."""
    at = at.astimezone(UTC)
    return f"{PREFIX}{at:%Y%m%dT%H%M%S}{at.microsecond // 1000:03d}Z"


def new_backup_path(into: str, at: datetime | None = None) -> str:
    """Where this run writes (a new directory; `into`, a local path, is made if missing)."""
    os.makedirs(into, exist_ok=True)
    return os.path.join(into, backup_name(at or datetime.now(UTC)))


def is_complete(path: str) -> bool:
    return os.path.exists(os.path.join(path, COMPLETE_MARK))


def prune(root: str, keep: int | None) -> list[str]:
    """Delete what a completed run leaves to delete (module docstring); returns the names
    deleted, oldest first."""
    names = sorted(name for name in os.listdir(root) if NAME.match(name))
    complete = [name for name in names if is_complete(os.path.join(root, name))]
    if not complete:
        return []
    doomed = [name for name in names if name not in complete and name < complete[-1]]
    if keep is not None:
        doomed += complete[:-keep]
    for name in sorted(doomed):
        os.rename(os.path.join(root, name), os.path.join(root, DELETING + name))
    for name in os.listdir(root):  # this run's, and any an earlier run left half-deleted
        if name.startswith(DELETING) and NAME.match(name.removeprefix(DELETING)):
            shutil.rmtree(os.path.join(root, name))
    return sorted(doomed)
