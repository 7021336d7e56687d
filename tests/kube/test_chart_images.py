"""Every image the chart runs, and every image the operator puts in topic pods, is pinned: an
exact release or a digest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.kube.builders.bundle import build_all
from delayq.kube.config import OperatorConfig
from delayq.kube.spec import BackupSchedule, TopicSpec
from delayq.queue.topic import TopicType
from tests.kube.chart_support import (
    CHART,
    CREDENTIALS,
    DIGEST,
    VALUE_SETS,
    operator_env,
    render,
    run_helm,
)

FULL_VERSION_TAG = re.compile(r"^v?\d+\.\d+\.\d+([-+._][0-9A-Za-z.+_-]*)?$")
DIGEST_SUFFIX = re.compile(r"@sha256:[0-9a-f]{64}$")


def floats(ref: str) -> bool:
    """An image reference that may run other content tomorrow: neither a digest nor a tag
    naming a full x.y.z version (`redis:7.4-bookworm`, `zookeeper:3.9`, no tag: `latest`)."""
    if DIGEST_SUFFIX.search(ref):
        return False
    name, _, tag = ref.rpartition(":")
    return not name or "/" in tag or not FULL_VERSION_TAG.match(tag)


def container_images(manifest: Any) -> Iterator[str]:
    """The image of every container, init container and ephemeral container in a manifest."""
    if isinstance(manifest, dict):
        for key, value in manifest.items():
            if key in ("containers", "initContainers", "ephemeralContainers"):
                yield from (container["image"] for container in value)
            else:
                yield from container_images(value)
    elif isinstance(manifest, list):
        for item in manifest:
            yield from container_images(item)


def topic_images(value_set: str) -> set[str]:
    """The images of every child the operator builds, for each topic type, with the image
    settings the chart hands it (the others may name files only a pod has)."""
    env = operator_env(value_set)
    names = ("DELAYQ_IMAGE", "DELAYQ_REDIS_IMAGE", "DELAYQ_PIPELINE_IMAGE")
    ctx = OperatorConfig.from_env({name: env[name] for name in names}).build
    backup = BackupSchedule("@daily", "backups")  # its CronJob runs the pipeline image
    return {
        image
        for topic_type in TopicType
        for manifest in build_all(
            TopicSpec(name="t", namespace="shop", topic_type=topic_type, backup=backup),
            ctx,
            CREDENTIALS,
            64,
            True,
        )
        for image in container_images(manifest)
    }


def test_the_floating_tag_check_tells_pinned_from_floating() -> None:
    assert all(map(floats, ["redis:7.4-bookworm", "zookeeper:3.9", "python:3.11-slim", "redis",
                            "registry:5000/redis", "redis:latest", "redis:7"]))
    assert not any(map(floats, ["redis:7.4.11-bookworm", "zookeeper:3.9.5", "ghcr.io/a/b:0.1.0",
                                "registry:5000/redis:7.4.11", f"redis@{DIGEST}",
                                f"redis:7.4@{DIGEST}"]))


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_no_image_floats_on_a_minor_tag(value_set: str) -> None:
    """Every image the chart runs, and every image the operator it configures puts in topic
    pods (the delay service, the Redis brokers, the backups), names an exact x.y.z release or a
    digest:
    a node pulling under IfNotPresent cannot run a patch the chart did not name."""
    chart = {image for doc in render(value_set) for image in container_images(doc)}
    topics = topic_images(value_set)
    assert chart  # the operator's image at least
    assert len(topics) == 3  # delayq, redis and the pipeline
    assert [image for image in chart | topics if floats(image)] == []


def test_image_digests_pin_every_image_by_content() -> None:
    """`image.digest`, `operator.redisImageDigest`, `operator.pipelineImageDigest` and
    `zookeeper.imageDigest` turn every reference into `<repository>@<digest>`, in the chart's
    pods and in the topics' pods."""
    docs = render("image-digests")
    expected = {f"ghcr.io/delayq/delayq@{DIGEST}", f"zookeeper@{DIGEST}"}
    assert {image for doc in docs for image in container_images(doc)} == expected
    assert topic_images("image-digests") == {
        f"ghcr.io/delayq/delayq@{DIGEST}",
        f"redis@{DIGEST}",
        f"ghcr.io/delayq/delayq-pipeline@{DIGEST}",
    }
    for bad in ("7.4.11", "sha256:abc", f"sha512:{DIGEST[7:]}"):
        result = run_helm("template", "rel", str(CHART), "--set", f"image.digest={bad}")
        assert result.returncode != 0, bad

