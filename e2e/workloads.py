"""Pods the real-pods tests run next to a topic: a webhook receiver, a producer and consumers.

Each is a small Python program run by the delayq image's own interpreter (no other image is
needed), handed over in a ConfigMap, and placed on the real node. What they observe they print
as one JSON object per line, which the tests read back with ``kubectl logs``.
"""

from __future__ import annotations

import json
from typing import Any

from e2e.harness.node import placement

RECEIVER_PORT = 8000

#: The webhook receiver: checks the Standard Webhooks signature with the library a receiver
#: would use, records every delivery (id, due and arrival time, verified) and answers 200.
RECEIVER = '''
import http.server, json, os, sys, threading, time
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

webhook = Webhook(os.environ["SIGNING_SECRET"])
lock = threading.Lock()  # one write per line: print() from two threads can interleave lines

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the sender reuses its pooled connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        at_ms = time.time() * 1000
        try:
            webhook.verify(body, dict(self.headers))
            verified = True
        except WebhookVerificationError:
            verified = False
        message = json.loads(body)
        line = json.dumps({"id": message["id"], "dueMs": message["dueMs"], "atMs": at_ms,
                           "attempt": message["attempt"], "verified": verified})
        with lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

class Server(http.server.ThreadingHTTPServer):
    # the standard library listens with a backlog of 5: a burst of new connections overflows
    # it and each dropped SYN is retried a second later (a 1 s tail that is the receiver's)
    request_queue_size = 1024
    daemon_threads = True


Server(("", 8000), Handler).serve_forever()
'''

#: The producer: schedules COUNT messages through the topic's Service, due over SPREAD_MS after
#: START_MS from now, in batches of BATCH; the items a 207 answer reports as not stored (a broker
#: that refused or did not answer) are sent again, as the API asks; prints how many it stored.
#: With PER_SECOND, batch i is not sent before i * BATCH / PER_SECOND seconds from its start
#: (a steady producer, e.g. through an upgrade); it gives up DEADLINE_S after its start.
PRODUCER = '''
import json, os, time, urllib.error, urllib.request

url = os.environ["API_URL"]
token = os.environ["API_TOKEN"]
count = int(os.environ["COUNT"])
prefix = os.environ["PREFIX"]
start_ms = int(os.environ["START_MS"])
spread_ms = int(os.environ["SPREAD_MS"])
batch_size = int(os.environ.get("BATCH", "200"))
per_second = float(os.environ.get("PER_SECOND", "0"))
started = time.monotonic()
deadline = started + float(os.environ.get("DEADLINE_S", "120"))
stored = resent = 0


def send(batch):
    body = json.dumps({"messages": batch}).encode()
    request = urllib.request.Request(url + "/messages/batch", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            results = json.load(response)["results"]
    except urllib.error.HTTPError as error:
        if error.code < 500 and error.code != 429:
            raise  # a refusal: retrying cannot help
        print(json.dumps({"retry": str(error)}), flush=True)
        return batch
    except OSError as error:  # the Service may not route yet
        print(json.dumps({"retry": str(error)}), flush=True)
        return batch
    return [message for message, result in zip(batch, results)
            if result["result"] not in ("created", "exists")]


messages = [{"id": f"{prefix}-{i}", "delayMs": start_ms + spread_ms * i // max(count, 1),
             "payload": f"message {i}"} for i in range(count)]
for first in range(0, count, batch_size):
    if per_second:
        time.sleep(max(0.0, started + first / per_second - time.monotonic()))
    batch = messages[first:first + batch_size]
    while batch:
        left = send(batch)
        stored += len(batch) - len(left)
        if left:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(left)} messages not stored before the deadline")
            resent += len(left)
            time.sleep(0.5)
        batch = left
print(json.dumps({"stored": stored, "resent": resent}), flush=True)
'''


#: The pull consumer: leases due messages through the topic's Service, records each (id, due and
#: lease time), acks them, until COUNT were seen or its deadline passes.
PULL_CONSUMER = '''
import json, os, sys, time, urllib.error, urllib.request

url = os.environ["API_URL"]
token = os.environ["API_TOKEN"]
count = int(os.environ["COUNT"])
deadline = time.monotonic() + 150
seen = set()


def call(path, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=15) as response:
        return json.load(response)


while len(seen) < count and time.monotonic() < deadline:
    try:
        leases = call("/leases", {"max": 100, "ackTimeoutMs": 30000, "waitMs": 1000})["leases"]
    except (urllib.error.HTTPError, OSError) as error:  # not routed yet, or a 503: again
        print(json.dumps({"retry": str(error)}), flush=True)
        time.sleep(0.5)
        continue
    at_ms = time.time() * 1000
    for lease in leases:
        seen.add(lease["id"])
        sys.stdout.write(json.dumps({"id": lease["id"], "dueMs": lease["dueMs"],
                                     "atMs": at_ms}) + "\\n")
    sys.stdout.flush()
    if leases:
        call("/leases/ack", {"tokens": [lease["token"] for lease in leases]})
print(json.dumps({"consumed": len(seen)}), flush=True)
'''


#: The stream consumer: reads the topic's target stream on broker 0 as the reader user (the URL
#: from the topic's reader Secret) through a consumer group, records each entry (id, due and
#: read time), acknowledges it, until COUNT were seen or its deadline passes.
STREAM_CONSUMER = '''
import json, os, sys, time
import redis

client = redis.Redis.from_url(os.environ["STREAM_URL"], socket_timeout=10)
stream = os.environ["STREAM_KEY"]
count = int(os.environ["COUNT"])
deadline = time.monotonic() + 150
seen = set()

while time.monotonic() < deadline:
    try:  # the group from the stream's beginning: nothing appended before this start is missed
        client.xgroup_create(stream, "e2e", id="0", mkstream=True)
        break
    except redis.ResponseError as error:
        if "BUSYGROUP" in str(error):
            break
        raise
    except redis.ConnectionError as error:  # the Service may not route yet
        print(json.dumps({"retry": str(error)}), flush=True)
        time.sleep(0.5)
while len(seen) < count and time.monotonic() < deadline:
    try:
        answer = client.xreadgroup("e2e", "consumer-1", {stream: ">"}, count=100, block=1000)
    except redis.ConnectionError as error:
        print(json.dumps({"retry": str(error)}), flush=True)
        time.sleep(0.5)
        continue
    at_ms = time.time() * 1000
    entries = [entry for _, batch in answer for entry in batch]
    for entry_id, fields in entries:
        seen.add(fields[b"id"])
        sys.stdout.write(json.dumps({"id": fields[b"id"].decode(),
                                     "dueMs": int(fields[b"dueMs"]), "atMs": at_ms}) + "\\n")
    sys.stdout.flush()
    if entries:
        client.xack(stream, "e2e", *[entry_id for entry_id, _ in entries])
print(json.dumps({"consumed": len(seen)}), flush=True)
'''


#: The ZooKeeper a hostile tenant runs (issue 27): listens on port 2181, answers a client's
#: first packet with a ZooKeeper ConnectResponse (session 1), so that a ZooKeeper client goes on
#: to send its `addauth` digest, then answers nothing more; prints every connection and every
#: byte it is sent (hex), so a test sees whether the operator connected or sent its password.
FAKE_ZOOKEEPER = '''
import json, selectors, socket, struct

CONNECT_RESPONSE = struct.pack(">iiiqi16s?", 37, 0, 10000, 1, 16, bytes(16), False)
server = socket.create_server(("", 2181), backlog=64)
selector = selectors.DefaultSelector()
selector.register(server, selectors.EVENT_READ)
answered = set()
print(json.dumps({"listening": 2181}), flush=True)
while True:
    for key, _ in selector.select():
        if key.fileobj is server:
            peer, address = server.accept()
            selector.register(peer, selectors.EVENT_READ, address[0])
            print(json.dumps({"connection": address[0]}), flush=True)
            continue
        try:
            data = key.fileobj.recv(65536)
        except OSError:
            data = b""
        if not data:
            selector.unregister(key.fileobj)
            answered.discard(key.fileobj)
            key.fileobj.close()
            continue
        print(json.dumps({"peer": key.data, "hex": data.hex()}), flush=True)
        if key.fileobj not in answered:
            answered.add(key.fileobj)
            try:
                key.fileobj.sendall(CONNECT_RESPONSE)
            except OSError:
                pass
'''

def config_map(name: str, namespace: str, script: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"main.py": script}}


def _container(name: str, image: str, env: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "/app/main.py"], "env": env,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": 10001,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "app", "mountPath": "/app"}],
    }


def _pod_spec(name: str, image: str, env: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {**placement(), **extra, "containers": [_container(name, image, env)],
            "volumes": [{"name": "app", "configMap": {"name": name}}]}


SIGNING_SECRET = "signing"  # the Secret (and its key) the topic signs with and the receiver checks


def receiver(namespace: str, image: str, signing_secret: str) -> list[dict[str, Any]]:
    """Secret ``signing``, ConfigMap, Deployment and Service ``receiver`` (port 80 -> 8000)."""
    labels = {"app": "receiver"}
    env = [{"name": "SIGNING_SECRET", "valueFrom": {"secretKeyRef": {
        "name": SIGNING_SECRET, "key": SIGNING_SECRET}}}]
    spec = _pod_spec("receiver", image, env)
    spec["containers"][0]["ports"] = [{"containerPort": RECEIVER_PORT}]
    spec["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": RECEIVER_PORT},
                                               "periodSeconds": 1}
    return [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": SIGNING_SECRET, "namespace": namespace},
         "stringData": {SIGNING_SECRET: signing_secret}},
        config_map("receiver", namespace, RECEIVER),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "receiver", "namespace": namespace},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": spec}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "receiver", "namespace": namespace},
         "spec": {"selector": labels,
                  "ports": [{"port": 80, "targetPort": RECEIVER_PORT}]}},
    ]


def _api_env(namespace: str, topic: str) -> list[dict[str, Any]]:
    """Where the topic's API is and its token (from the topic's Secret)."""
    return [
        {"name": "API_URL", "value": f"http://{topic}-api.{namespace}.svc:8080/v1/topics/{topic}"},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": f"{topic}-credentials", "key": "api-token"}}},
    ]


def _job(name: str, namespace: str, image: str, script: str, env: list[dict[str, Any]],
         labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [
        config_map(name, namespace, script),
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"backoffLimit": 0, "template": {
             "metadata": {"labels": dict(labels or {})},
             "spec": _pod_spec(name, image, env, restartPolicy="Never")}}},
    ]


def pull_consumer(namespace: str, image: str, topic: str, name: str,
                  count: int) -> list[dict[str, Any]]:
    """ConfigMap and Job ``name``: leases and acks ``count`` messages of a pull topic."""
    return _job(name, namespace, image, PULL_CONSUMER,
                [*_api_env(namespace, topic), {"name": "COUNT", "value": str(count)}])


#: The labels of the stream consumer's pod, which the topic's networkPolicy.allowFrom names.
STREAM_CONSUMER_LABELS = {"app": "stream-consumer"}


def stream_consumer(namespace: str, image: str, topic: str, stream_key: str, name: str,
                    count: int) -> list[dict[str, Any]]:
    """ConfigMap and Job ``name`` (labelled ``STREAM_CONSUMER_LABELS``): reads and acks
    ``count`` entries of a stream topic's target stream on broker 0, logged in with the
    ``url`` of the topic's ``<topic>-stream-reader`` Secret."""
    env: list[dict[str, Any]] = [
        {"name": "STREAM_URL", "valueFrom": {"secretKeyRef": {
            "name": f"{topic}-stream-reader", "key": "url"}}},
        {"name": "STREAM_KEY", "value": stream_key},
        {"name": "COUNT", "value": str(count)},
    ]
    return _job(name, namespace, image, STREAM_CONSUMER, env, STREAM_CONSUMER_LABELS)


def producer(namespace: str, image: str, topic: str, name: str, count: int, start_ms: int,
             spread_ms: int, per_second: float = 0, batch: int = 200,
             deadline_s: int = 120) -> list[dict[str, Any]]:
    """ConfigMap and Job ``name``: schedules ``count`` messages ``<name>-<i>`` through the
    topic's API Service with the topic's own token (from its Secret), in batches of ``batch``,
    at most ``per_second`` when given (``PRODUCER``)."""
    env: list[dict[str, Any]] = [
        *_api_env(namespace, topic),
        {"name": "COUNT", "value": str(count)},
        {"name": "PREFIX", "value": name},
        {"name": "START_MS", "value": str(start_ms)},
        {"name": "SPREAD_MS", "value": str(spread_ms)},
        {"name": "BATCH", "value": str(batch)},
        {"name": "PER_SECOND", "value": str(per_second)},
        {"name": "DEADLINE_S", "value": str(deadline_s)},
    ]
    return _job(name, namespace, image, PRODUCER, env)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a log, one per line (other lines skipped)."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def fake_zookeeper(namespace: str, image: str, name: str) -> list[dict[str, Any]]:
    """ConfigMap, Deployment and Service ``name`` (port 2181): ``FAKE_ZOOKEEPER``, the
    ZooKeeper a tenant runs in its own namespace. No probe: a probe's connections would be
    recorded as clients."""
    labels = {"app": name}
    spec = _pod_spec(name, image, [])
    spec["containers"][0]["ports"] = [{"containerPort": 2181}]
    return [
        config_map(name, namespace, FAKE_ZOOKEEPER),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": spec}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"port": 2181, "targetPort": 2181}]}},
    ]
