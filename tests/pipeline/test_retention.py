"""Scheduled backups' retention (pipeline/retention.py) on a real directory: the newest
complete backups stay, an unfinished older one goes, nothing else is touched, and a run killed
mid-delete leaves nothing that looks like a complete backup."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from delayq.pipeline import retention


def _backup(root: Path, name: str, *, complete: bool) -> None:
    (root / name / "items").mkdir(parents=True)
    (root / name / "items" / "part-0.parquet").write_bytes(b"x")
    if complete:
        (root / name / "manifest").mkdir()
        (root / name / "manifest" / "_SUCCESS").write_bytes(b"")


def test_the_newest_complete_backups_stay_and_older_leftovers_go(tmp_path: Path) -> None:
    for day in (1, 2, 3, 4):
        _backup(tmp_path, f"backup-2026110{day}T031500000Z", complete=day != 2)
    _backup(tmp_path, "backup-20261105T031500000Z", complete=False)  # running now: newer
    (tmp_path / "notes.txt").write_text("the tenant's own file")
    (tmp_path / "backup-manual").mkdir()  # not a name of ours
    deleted = retention.prune(str(tmp_path), keep=2)
    assert deleted == ["backup-20261101T031500000Z", "backup-20261102T031500000Z"]
    assert sorted(os.listdir(tmp_path)) == [
        "backup-20261103T031500000Z",
        "backup-20261104T031500000Z",
        "backup-20261105T031500000Z",
        "backup-manual",
        "notes.txt",
    ]
    assert retention.prune(str(tmp_path), keep=None) == []  # keep: all complete ones


def test_a_half_deleted_backup_never_looks_complete_and_goes_next_time(tmp_path: Path) -> None:
    _backup(tmp_path, "backup-20261101T031500000Z", complete=True)
    _backup(tmp_path, "backup-20261102T031500000Z", complete=True)
    # a run killed between the rename and the delete left this behind
    _backup(tmp_path, "deleting-backup-20261030T031500000Z", complete=True)
    assert retention.prune(str(tmp_path), keep=1) == ["backup-20261101T031500000Z"]
    assert os.listdir(tmp_path) == ["backup-20261102T031500000Z"]


def test_no_complete_backup_deletes_nothing(tmp_path: Path) -> None:
    _backup(tmp_path, "backup-20261101T031500000Z", complete=False)
    assert retention.prune(str(tmp_path), keep=1) == []
    assert os.listdir(tmp_path) == ["backup-20261101T031500000Z"]


def test_names_sort_in_time_order() -> None:
    early = retention.backup_name(datetime(2026, 11, 29, 3, 15, 0, 7000, tzinfo=UTC))
    late = retention.backup_name(datetime(2026, 11, 29, 3, 15, 0, 12000, tzinfo=UTC))
    assert early == "backup-20261129T031500007Z" < late
    assert retention.NAME.match(early)
