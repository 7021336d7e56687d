"""The operator's `topic.json` (`delayq serve --config`) → ServiceConfig settings (pure).

Contract (docs/operator.md, built by `delayq.kube.builders.service.topic_config`): the topic's
settings, its brokers (`redis.masterHostTemplate` with `{broker}` = 0..brokers-1), ZooKeeper and
the HTTP port. Secrets are not in the file: the pod's environment carries
`DELAYQ_REDIS_PASSWORD` and `DELAYQ_API_TOKEN`, and `POD_NAME` (`<topic>-service-<i>`) names the
member and, by its ordinal, the broker it prefers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from delayq.service.config import ConfigError

DEFAULT_REDIS_PORT = 6379


def read_topic_file(path: str | Path, env: Mapping[str, str]) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"--config {path}: {error}") from error
    return settings_from_topic(document, env)


def settings_from_topic(document: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """ServiceConfig keyword arguments from the operator's document and the pod environment."""
    try:
        delivery = document.get("delivery", {})
        zookeeper = document.get("zookeeper", {})
        settings: dict[str, Any] = {
            "namespace": document["namespace"],
            "topic": document["topic"],
            "slot_amount": int(document["slotAmount"]),
            "topic_type": document["topicType"],
            "max_retries": int(document["maxRetries"]),
            "ack_timeout_ms": int(document["ackTimeoutMs"]),
            "max_payload_bytes": int(document["maxPayloadBytes"]),
            "journal_maxlen": int(document.get("journalMaxLen", 0)),
            "webhook_url": delivery.get("webhookUrl") or "",
            "webhook_timeout_ms": int(delivery.get("webhookTimeoutMs", 5000)),
            "webhook_concurrency": int(delivery.get("webhookMaxInFlight", 64)),
            "max_lease_batch": int(delivery.get("pullMaxLeaseBatch", 1000)),
            "stream_key": delivery.get("streamKey") or "",
            "stream_maxlen": int(delivery.get("streamMaxLen") or 0),
            "zookeeper": zookeeper.get("connect", ""),
            "zk_session_timeout_ms": int(zookeeper.get("sessionTimeoutMs", 10_000)),
            "port": int(document.get("http", {}).get("port", 8080)),
            "host": "0.0.0.0",  # in a pod: reachable by probes, the Service and Prometheus
        }
        worker = document.get("worker", {})
        if "concurrency" in worker:
            settings["max_in_flight"] = int(worker["concurrency"])
        urls = broker_urls(document, env.get("DELAYQ_REDIS_PASSWORD", ""))
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"topic file: missing or invalid {error}") from error
    settings["redis_url"] = urls[0]
    settings["broker_urls"] = ",".join(urls)
    if env.get("POD_NAME"):
        settings["member_id"] = env["POD_NAME"]
        settings["broker_id"] = env["POD_NAME"]  # its ordinal is the preferred broker
    return settings


def broker_urls(document: Mapping[str, Any], password: str) -> list[str]:
    """One Redis URL per broker index, from the master host template."""
    redis = document["redis"]
    template = redis["masterHostTemplate"]
    port = int(redis.get("port", DEFAULT_REDIS_PORT))
    auth = f":{quote(password, safe='')}@" if password else ""
    count = int(document.get("brokers", 1))
    return [f"redis://{auth}{template.format(broker=b)}:{port}/0" for b in range(count)]
