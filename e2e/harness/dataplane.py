"""A topic's data plane run locally, as the documented test-only way under KWOK (whose pods
never run): local redis-servers play its broker pods, ``delayq serve`` from its ConfigMap plays
its first delay-service pod, and the tests talk to that process's HTTP API.

Only the broker URLs and the listen address differ from the pods: the users, passwords, ACL
rules and the topic document are the ones the operator wrote, so what works here works with
what the operator provisions.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from delayq.local.ports import free_port
from delayq.local.waiting import wait_until
from delayq.queue import acl, functions
from e2e.harness.kube import Kube
from e2e.harness.process import INTERVAL_S, NOT_YET, REPO, ManagedProcess
from e2e.harness.topics import topic_secret


def like_a_broker_pod(kube: Kube, namespace: str, topic: str, port: int) -> None:
    """Give a local redis-server the users a broker pod of the topic starts with: the rules
    from the Redis StatefulSet's environment, the passwords from the topic's Secret; and the
    engine's functions library, loaded as the admin user."""
    statefulset = kube.get("statefulset", f"{topic}-redis-0", namespace)
    assert statefulset is not None
    env = {item["name"]: item.get("value", "") for item in
           statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    admin_password = topic_secret(kube, namespace, topic, "redis-admin-password")
    with redis.Redis(port=port) as server:
        server.execute_command("ACL", "SETUSER", env["ADMIN_USER"],
                               *env["ADMIN_USER_RULES"].split(), f">{admin_password}")
        server.execute_command("ACL", "SETUSER", env["SERVICE_USER"],
                               *env["SERVICE_USER_RULES"].split(),
                               f">{topic_secret(kube, namespace, topic, 'redis-password')}")
        server.config_set("masteruser", env["ADMIN_USER"])
        server.config_set("masterauth", admin_password)
        server.execute_command("ACL", "SETUSER", "default", "off")
    with admin(port, admin_password) as client:
        functions.load(client)  # as the operator's health pass does on the masters it reaches


def admin(port: int, admin_password: str) -> redis.Redis:
    """A client of a local broker as the operator's admin user."""
    return redis.Redis(port=port, username=acl.ADMIN_USER, password=admin_password)


def replication(port: int, admin_password: str) -> dict[str, Any]:
    """``INFO replication`` of a local broker."""
    with admin(port, admin_password) as client:
        info: dict[str, Any] = client.info("replication")
    return info


def pod_env_from_secret(kube: Kube, namespace: str, topic: str) -> dict[str, str]:
    """What a delay-service pod's environment takes from the topic's Secret: each
    secretKeyRef of the service StatefulSet resolved the way the kubelet would (an optional
    key the Secret lacks is left out), so the process gets exactly what the operator wires."""
    statefulset = kube.get("statefulset", f"{topic}-service", namespace)
    secret = kube.get("secret", f"{topic}-credentials", namespace)
    assert statefulset is not None
    assert secret is not None
    env: dict[str, str] = {}
    for item in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            continue
        assert ref["name"] == f"{topic}-credentials", ref
        value = secret["data"].get(ref["key"])
        assert value is not None or ref.get("optional"), f"the Secret lacks {ref['key']}"
        if value is not None:
            env[item["name"]] = base64.b64decode(value).decode()
    return env


def service_url(password: str, port: int) -> str:
    """The broker URL `delayq serve` gets in a pod (topic.json), pointed at a local port."""
    return f"redis://{acl.SERVICE_USER}:{password}@127.0.0.1:{port}/0"


def start_serve(kube: Kube, namespace: str, topic: str, workdir: Path,
                broker_url: str, *more_brokers: str) -> tuple[ManagedProcess, str]:
    """``delayq serve`` from the topic's ConfigMap and the Secret's keys its StatefulSet
    names, on a local port, against local brokers (broker 0's URL, then the others').

    Only the broker URLs and the listen address are overridden: pods do not run under KWOK,
    so the process plays the topic's first delay-service pod. Returns it and its base URL.
    """
    config_map = kube.get("configmap", f"{topic}-config", namespace)
    assert config_map is not None
    topic_file = workdir / "topic.json"
    topic_file.write_text(config_map["data"]["topic.json"])
    port = free_port()
    env = {**os.environ, **pod_env_from_secret(kube, namespace, topic),
           "POD_NAME": f"{topic}-service-0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(
               [str(REPO / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log_path = workdir / f"serve-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-c", "import sys; from delayq.cli import main; sys.exit(main())",
             "serve", "--config", str(topic_file), "--host", "127.0.0.1", "--port", str(port),
             "--redis-url", broker_url, "--broker-urls", ",".join([broker_url, *more_brokers])],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
    serve = ManagedProcess("delayq-serve", popen, log_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200,
                   timeout_s=60, what="delayq serve to be ready", abort=serve.exited,
                   interval_s=INTERVAL_S, not_yet=NOT_YET)
    except Exception:
        print(f"--- delayq serve log tail:\n{serve.tail(30)}")
        serve.stop()  # the caller never gets it: stop it here, not leave it running
        raise
    return serve, base


def schedule(base: str, topic: str, token: str, message_id: str, delay_ms: int) -> None:
    """POST one message to the topic's HTTP API; any non-2xx answer fails the test."""
    assert 200 <= schedule_status(base, topic, token, message_id, delay_ms) < 300


def schedule_status(base: str, topic: str, token: str, message_id: str, delay_ms: int) -> int:
    """POST one message to the topic's HTTP API; the answer's status code."""
    request = urllib.request.Request(
        f"{base}/v1/topics/{topic}/messages", method="POST",
        data=json.dumps({"id": message_id, "delayMs": delay_ms, "payload": "hello"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
