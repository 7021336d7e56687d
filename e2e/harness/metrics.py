"""Prometheus samples out of a /metrics page, however the test got it (a local process's port,
or `kubectl exec` in a pod)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called ``name`` (e.g. ``delayq_scheduled_total``)."""
    return [(sample.labels, sample.value) for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]
