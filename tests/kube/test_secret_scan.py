"""No secret outside a Secret: what the operator writes for a topic, scanned for planted ones.

A tenant's credentials (a webhook URL's password or query token, its extra headers, a stream
target's URL) and the topic's generated ones (API, read and /metrics tokens, passwords) may be
in Secrets only: never in the ConfigMap's topic.json, a StatefulSet, Service, NetworkPolicy or
ServiceMonitor, the topic's status, an Event, or the operator's log. The service side (a real
`delayq serve` process's log) is `tests/service/test_processes.py`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging

import kmock
import kopf
import pytest

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.operator import serialized
from tests.kube.pods import NAMESPACE
from tests.kube.test_handlers import body, existing, put_topic, update_spec

PLANTED = "pl4nted-s3cret"


def encoded(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


async def run(ctx: OperatorContext, api: kmock.KubernetesEmulator, logger: logging.Logger) -> None:
    with contextlib.suppress(kopf.TemporaryError, kopf.PermanentError):
        await serialized(ctx, body(api), logger, reconcile)


async def test_no_secret_reaches_an_object_status_event_or_log_of_the_operator(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    api.objects["v1/secrets", NAMESPACE, "hooks"] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hooks", "namespace": NAMESPACE},
        "data": {
            "url": encoded(f"https://shop:{PLANTED}@hooks.example.com/h?token={PLANTED}"),
            "headers": encoded(f"Authorization: Bearer {PLANTED}"),
        },
    }
    refs = {
        "urlSecretRef": {"name": "hooks", "key": "url"},
        "extraHeadersSecretRef": {"name": "hooks", "key": "headers"},
    }
    put_topic(api, topicType="webhook", delivery={"webhook": refs})
    await run(ctx, api, logger)
    credentials = existing(api, "v1/secrets", "orders-credentials")["data"]
    generated = [base64.b64decode(value).decode() for value in credentials.values()]
    assert len(generated) >= 6  # passwords and the API, read and /metrics tokens
    configmap = existing(api, "v1/configmaps", "orders-config")
    assert json.loads(configmap["data"]["topic.json"])["webhook_url"] == ""
    # the tenant writes the URL into the spec: refused, and said so without repeating it
    leaky = f"https://shop:{PLANTED}@hooks.example.com/h?token={PLANTED}"
    replaced = {"url": leaky, "urlSecretRef": None, "extraHeadersSecretRef": None}  # merge patch
    update_spec(api, topicType="webhook", delivery={"webhook": replaced})
    await run(ctx, api, logger)
    ready = {c["type"]: c for c in body(api)["status"]["conditions"]}["Ready"]
    assert ready["reason"] == "InvalidSpec"
    assert "must not carry credentials" in ready["message"]

    # everything but Secrets, and the topic without its spec (what the tenant typed)
    written = [
        {k: v for k, v in obj.raw.items() if not (k == "spec" and obj.raw["kind"] == "DelayTopic")}
        for key, obj in api.objects.items()
        if key[0].plural != "secrets" and not obj.deleted
    ]
    kinds = {item.get("kind") for item in written}
    assert {"ConfigMap", "StatefulSet", "Service", "NetworkPolicy", "Event"} <= kinds
    scanned = json.dumps(written) + "\n".join(r.getMessage() for r in caplog.records)
    for secret in (PLANTED, *generated):
        assert secret not in scanned, secret
