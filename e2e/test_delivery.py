"""A message through a topic the operator provisioned, received on time on a webhook (issue 5,
point 8), with the topic's credentials closing its ZooKeeper tree and its read-only token
reading only."""

from __future__ import annotations

import urllib.request

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.dataplane import (
    like_a_broker_pod,
    schedule,
    schedule_status,
    service_url,
    start_serve,
)
from e2e.harness.kube import Kube
from e2e.harness.operator import LocalOperator
from e2e.harness.process import INTERVAL_S, NOT_YET, ManagedProcess
from e2e.harness.receiver import Received, received_one
from e2e.harness.topics import delay_topic, topic_credentials, topic_secret, wait_reconciled


def _assert_read_token_reads_only(base: str, topic: str, read_token: str) -> None:
    """The Secret's read-only token, as the pods get it: the overview answers, a write is a
    403 (the dashboard's viewers on Kubernetes)."""
    request = urllib.request.Request(f"{base}/v1/topics/{topic}/overview",
                                     headers={"Authorization": f"Bearer {read_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert schedule_status(base, topic, read_token, "viewer-write", 1000) == 403


def _assert_tree_closed_to_strangers(zookeeper: ZooKeeperServer, namespace: str,
                                     topic: str) -> None:
    """A client without the topic's credentials can read and write none of its nodes."""
    root = f"/delayq/{namespace}/{topic}"
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=30)
    try:
        for node in (f"{root}/routing", f"{root}/assignment", f"{root}/members"):
            with pytest.raises(NoAuthError):
                client.get(node)
            with pytest.raises(NoAuthError):
                client.set(node, b"hijacked")
    finally:
        client.stop()
        client.close()


def test_message_end_to_end_through_the_provisioned_topic(
    kube: Kube, operator: LocalOperator, topics_ns: str, tmp_path_factory: pytest.TempPathFactory,
    webhook_receiver: tuple[str, Received], zookeeper: ZooKeeperServer,
) -> None:
    """Point 8: schedule through the provisioned topic's API, receive it on the webhook.

    The data plane runs locally (the documented test-only way, pods do not run under KWOK): a
    real redis-server protected by the password from the topic's Secret, and ``delayq serve``
    started from the topic.json the operator wrote into the topic's ConfigMap, with only the
    broker address and listen port overridden to local ones. ZooKeeper routing is the one the
    operator published. The message must arrive, never before its due time. The topic's
    ZooKeeper tree, written by the operator and by the service, is closed to anyone else.
    The Secret's read-only token reads and cannot write.
    """
    url, received = webhook_receiver
    kube.apply(delay_topic("hooks", slotAmount=16, brokers=1, replicasPerBroker=1,
                           topicType="webhook",
                           delivery={"webhook": {"url": url, "allowPrivateTargets": True,
                                                 "allowInsecureHttp": True}}), topics_ns)
    wait_reconciled(kube, operator, topics_ns, "hooks")
    password, token = topic_credentials(kube, topics_ns, "hooks")
    workdir = tmp_path_factory.mktemp("dataplane")

    broker = RedisServer().start()
    serve: ManagedProcess | None = None
    try:
        like_a_broker_pod(kube, topics_ns, "hooks", broker.port)
        serve, base = start_serve(kube, topics_ns, "hooks", workdir,
                                  service_url(password, broker.port))
        _assert_tree_closed_to_strangers(zookeeper, topics_ns, "hooks")
        _assert_read_token_reads_only(base, "hooks",
                                      topic_secret(kube, topics_ns, "hooks", "read-token"))
        schedule(base, "hooks", token, "e2e-1", delay_ms=2000)
        arrival_ms, message = wait_until(lambda: received_one(received, "e2e-1"), timeout_s=60,
                                         what="the message at the webhook receiver",
                                         abort=serve.exited, interval_s=INTERVAL_S,
                                         not_yet=NOT_YET)
        assert message["dueMs"] <= arrival_ms, "delivered before it was due"
        print(f"e2e: message delivered {arrival_ms - message['dueMs']} ms after due")
    except Exception:
        if serve is not None:
            print(f"--- delayq serve log tail:\n{serve.tail(60)}")
        raise
    finally:
        if serve is not None:
            serve.stop()
        broker.stop()
