"""status.backup: what the topic's scheduled backups last did, read from their CronJob.

The CronJob (kube/builders/backup.py) is written by the reconcile; the health pass reads its
status on every pass and reports it, so `kubectl get delaytopic -o yaml` tells when the last
backup ran and whether it completed, without reading Jobs or pods (the operator may not).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from delayq.kube import naming
from delayq.kube.client import KubeClient
from delayq.kube.spec import TopicSpec


class BackupResult(enum.StrEnum):
    """How the last scheduled backup ended."""

    MISSING = "Missing"  # no CronJob (not provisioned yet, or refused: the Provisioned reason)
    NEVER = "Never"  # no run was scheduled yet
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"  # the last run completed (its backup is on the claim)
    FAILED = "Failed"  # the last scheduled run ended without completing (its Job's events)


def backup_status(spec: TopicSpec, cron_job: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.backup of a topic with spec.backup, from its CronJob (None: absent). Times are
    the CronJob's RFC 3339 UTC strings, which compare in time order."""
    assert spec.backup is not None
    fields: dict[str, Any] = {
        "cronJob": naming.backup_cron_job(spec.name),
        "schedule": spec.backup.schedule,
        "volumeClaim": spec.backup.volume_claim,
    }
    if cron_job is None:
        return {**fields, "lastResult": BackupResult.MISSING.value}
    status = cron_job.get("status") or {}
    scheduled = status.get("lastScheduleTime")
    succeeded = status.get("lastSuccessfulTime")
    if scheduled:
        fields["lastScheduleTime"] = scheduled
    if succeeded:
        fields["lastSuccessfulTime"] = succeeded
    if status.get("active"):
        result = BackupResult.RUNNING
    elif succeeded and (not scheduled or succeeded >= scheduled):
        # a run made by hand (`kubectl create job --from=cronjob/...`) has no schedule time:
        # the CronJob controller still records its success
        result = BackupResult.SUCCEEDED
    elif not scheduled:
        result = BackupResult.NEVER
    else:
        result = BackupResult.FAILED
    return {**fields, "lastResult": result.value}


async def observe_backups(kube: KubeClient, spec: TopicSpec) -> dict[str, Any] | None:
    """The `backup` status field of this pass: the CronJob's report while spec.backup is set,
    None (the field removed) once it is not."""
    if spec.backup is None:
        return None
    name = naming.backup_cron_job(spec.name)
    return backup_status(spec, await kube.get("batch/v1", "CronJob", spec.namespace, name))
