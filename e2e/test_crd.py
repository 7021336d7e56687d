"""The DelayTopic CRD on a real API server: established, validated by CEL, printed, stored.

Unit tests check the examples against the OpenAPI schema with a Python validator; only a real
kube-apiserver also compiles the CEL rules (including their cost budget), evaluates transition
rules against the stored object, applies defaults and serves the printer columns. Each invalid
spec must be rejected with the message the CRD gives for it, because that message is the user
interface of a bad ``kubectl apply``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.kube import Kube, KubectlError, condition
from e2e.harness.process import REPO
from e2e.harness.topics import delay_topic

CRD_FILE = REPO / "crds" / "delaytopics.delayq.io.yaml"
CRD_NAME = "delaytopics.delayq.io"
EXAMPLES = REPO / "examples"


def _examples(kind: str) -> list[Path]:
    return sorted((EXAMPLES / kind).glob("*.yaml"))


def _expected_error(path: Path) -> str:
    """The ``# expect-error: <text>`` header every invalid/transition example starts with."""
    first = path.read_text().splitlines()[0]
    prefix = "# expect-error:"
    assert first.startswith(prefix), f"{path} lacks its '{prefix}' first line"
    return first[len(prefix):].strip()


#: Specs the issue names explicitly, with (a substring of) the API server's rejection. They are
#: kept here as well as in examples/ so the e2e suite states its own acceptance criteria.
INVALID_SPECS: dict[str, tuple[dict[str, Any], str]] = {
    "slot-amount-3": ({"slotAmount": 3}, "slotAmount must be a power of two"),
    "slot-amount-0": ({"slotAmount": 0}, "spec.slotAmount"),
    "slot-amount-too-big": ({"slotAmount": 32768}, "spec.slotAmount"),
    "webhook-without-url": ({"topicType": "webhook"},
                            "a webhook topic needs exactly one of spec.delivery.webhook.url "
                            "and urlSecretRef"),
    "webhook-url-not-http": ({"topicType": "webhook",
                              "delivery": {"webhook": {"url": "ftp://x"}}},
                             "spec.delivery.webhook.url"),
    "webhook-url-http": ({"topicType": "webhook",
                          "delivery": {"webhook": {"url": "http://hooks.example/h"}}},
                         "spec.delivery.webhook.url: Invalid value"),
    "webhook-url-with-credentials": ({"topicType": "webhook",
                                      "delivery": {"webhook": {
                                          "url": "https://u:hunter2@hooks.example/h"}}},
                                     "spec.delivery.webhook.url: Invalid value"),
    "webhook-signing-secret-bad-key": ({"topicType": "webhook",
                                        "delivery": {"webhook": {
                                            "url": "https://hooks.example/h",
                                            "signingSecretRef": {"name": "s", "key": "a/b"}}}},
                                       "a Secret key must consist of letters"),
    "brokers-0": ({"brokers": 0}, "spec.brokers"),
    "brokers-65": ({"brokers": 65, "slotAmount": 128}, "spec.brokers"),
    "brokers-exceed-slots": ({"brokers": 8, "slotAmount": 4},
                             "brokers must not exceed slotAmount"),
    "brokers-exceed-slots-at-field": ({"brokers": 8, "slotAmount": 4},
                                      "spec.brokers: Invalid value"),
    "brokers-exceed-slots-values": ({"brokers": 8, "slotAmount": 4},
                                    "(brokers=8, slotAmount=4)"),
    "webhook-section-on-pull-at-field": ({"topicType": "pull",
                                          "delivery": {"webhook": {"url": "http://x/h"}}},
                                         "spec.delivery.webhook: Invalid value"),
    "replicas-per-broker-6": ({"replicasPerBroker": 6}, "spec.replicasPerBroker"),
    "max-retries-negative": ({"maxRetries": -1}, "spec.maxRetries"),
    "max-retries-1001": ({"maxRetries": 1001}, "spec.maxRetries"),
    "ack-timeout-48h": ({"ackTimeout": "48h"}, "ackTimeout must be between 1ms and 24h"),
    "ack-timeout-garbage": ({"ackTimeout": "soon"}, "spec.ackTimeout"),
    "unknown-topic-type": ({"topicType": "kafka"}, "spec.topicType"),
}

#: Names whose derived names (``<name>-redis-63-headless``, the StatefulSet ``<name>-redis-63``)
#: would be invalid, with the rejection; the rule's fieldPath puts it at metadata.name.
INVALID_NAMES: dict[str, tuple[str, str]] = {
    "name-44-characters": ("t" * 44, "metadata.name must be at most 43 characters"),
    "name-length-shown": ("t" * 50, "(length=50)"),
    "name-dotted": ("orders.eu", "metadata.name must be a DNS label that Services accept"),
    "name-digit-first": ("1orders", "metadata.name must be a DNS label that Services accept"),
    "name-at-the-field": ("orders.eu", "metadata.name: Invalid value"),
}

#: (first spec, second spec, message): the second, applied over the first, must be rejected.
INVALID_TRANSITIONS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "slot-shrink": ({"slotAmount": 32}, {"slotAmount": 16},
                    "slotAmount may grow but never shrink: the removed slots would still hold "
                    "messages (stored 32, requested 16)"),
    "broker-shrink": ({"brokers": 2}, {"brokers": 1},
                      "brokers may grow but never shrink"),
    "type-change": ({"topicType": "pull"},
                    {"topicType": "webhook",
                     "delivery": {"webhook": {"url": "http://127.0.0.1:9/hook",
                                              "allowInsecureHttp": True}}},
                    "topicType is immutable"),
}


@pytest.fixture(scope="module")
def crd(kube: Kube) -> dict[str, Any]:
    """The DelayTopic CRD applied from crds/ and Established (module-wide; left installed).

    It stays installed so that later modules (the chart, the operator) find it; applying the
    same file again is a no-op.
    """
    if not CRD_FILE.exists():
        pytest.skip(f"{CRD_FILE.relative_to(REPO)} does not exist yet")
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))

    def established_crd() -> dict[str, Any] | None:
        obj = kube.get("crd", CRD_NAME)
        return obj if condition(obj, "Established") == "True" else None

    established = kube.wait(established_crd, timeout_s=60,
                            what=f"CRD {CRD_NAME} to be Established")
    # Discovery must serve the new kind before kubectl can resolve "dt"; wait for it, not sleep.
    kube.wait(lambda: kube.kubectl("get", "dt", "-A", check=False).returncode == 0,
              timeout_s=60, what="kubectl to resolve the short name dt")
    return established


def _reject_message(kube: Kube, manifest: dict[str, Any] | str, namespace: str) -> str:
    """Apply (server-side dry run) and return the rejection; fail if the server accepted it."""
    try:
        out = kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                           input=manifest if isinstance(manifest, str)
                           else yaml.safe_dump(manifest))
    except KubectlError as exc:
        return exc.stderr
    pytest.fail(f"the API server accepted an invalid DelayTopic: {out.stdout}")


def test_crd_is_established_with_names(crd: dict[str, Any]) -> None:
    """Established and NamesAccepted, with the plural, kind and short name of the contract
    (docs/contracts.md §3)."""
    assert condition(crd, "NamesAccepted") == "True"
    names = crd["spec"]["names"]
    assert names["kind"] == "DelayTopic"
    assert names["plural"] == "delaytopics"
    assert "dt" in names["shortNames"]
    assert crd["spec"]["scope"] == "Namespaced"


@pytest.mark.parametrize("example", _examples("valid"), ids=lambda p: p.stem)
def test_valid_example_is_accepted(
    kube: Kube, crd: dict[str, Any], namespace: str, example: Path
) -> None:
    """Every example in examples/valid is accepted and comes back with its defaults filled in."""
    out = kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example),
                       "-o", "json").stdout
    stored = json.loads(out)
    assert stored["spec"]["slotAmount"] >= 1
    assert stored["spec"]["topicType"] in {"pull", "webhook", "stream"}


@pytest.mark.parametrize("example", _examples("invalid"), ids=lambda p: p.stem)
def test_invalid_example_is_rejected_with_its_message(
    kube: Kube, crd: dict[str, Any], namespace: str, example: Path
) -> None:
    """Every example in examples/invalid is rejected with the text of its expect-error line."""
    message = _reject_message(kube, example.read_text(), namespace)
    assert _expected_error(example) in message


@pytest.mark.parametrize(("spec", "expected"), INVALID_SPECS.values(), ids=INVALID_SPECS.keys())
def test_invalid_spec_is_rejected_with_its_message(
    kube: Kube, crd: dict[str, Any], namespace: str, spec: dict[str, Any], expected: str
) -> None:
    """The issue's invalid specs (slotAmount 3, webhook without URL, out of range) are refused."""
    message = _reject_message(kube, delay_topic("bad", **spec), namespace)
    assert expected in message, message


@pytest.mark.parametrize(("name", "expected"), INVALID_NAMES.values(), ids=INVALID_NAMES.keys())
def test_invalid_name_is_rejected_with_its_message(
    kube: Kube, crd: dict[str, Any], namespace: str, name: str, expected: str
) -> None:
    """A name the operator could not derive valid object names from is refused at apply,
    instead of an ApplyFailed retried forever."""
    message = _reject_message(kube, delay_topic(name), namespace)
    assert expected in message, message


def test_name_at_the_bound_is_accepted(kube: Kube, crd: dict[str, Any], namespace: str) -> None:
    """43 characters is the longest name whose derived names are all valid."""
    kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                 input=yaml.safe_dump(delay_topic("t" * 43)))


def _apply_transition(kube: Kube, namespace: str, first: dict[str, Any] | str,
                      second: dict[str, Any] | str, name: str) -> str:
    """Create ``first`` for real, apply ``second`` over it, return the rejection message.

    Transition rules (``oldSelf``) only run on update, so the first object must be stored.
    The stored spec must be unchanged afterwards.
    """
    kube.apply(first, namespace)
    before = kube.get("dt", name, namespace)
    assert before is not None
    message = _reject_message(kube, second, namespace)
    try:
        kube.apply(second, namespace)
    except KubectlError:
        pass
    else:
        pytest.fail("a rejected transition was accepted by a real apply")
    after = kube.get("dt", name, namespace)
    assert after is not None
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    return message


@pytest.mark.parametrize(("first", "second", "expected"), INVALID_TRANSITIONS.values(),
                         ids=INVALID_TRANSITIONS.keys())
def test_invalid_transition_is_rejected(
    kube: Kube, crd: dict[str, Any], namespace: str,
    first: dict[str, Any], second: dict[str, Any], expected: str,
) -> None:
    """Changing slots (until resharding exists), shrinking brokers and changing the topic
    type are refused on update."""
    message = _apply_transition(kube, namespace, delay_topic("t", **first),
                                delay_topic("t", **second), "t")
    assert expected in message, message


@pytest.mark.parametrize("example", _examples("transitions"), ids=lambda p: p.stem)
def test_transition_example_is_rejected(
    kube: Kube, crd: dict[str, Any], namespace: str, example: Path
) -> None:
    """Every examples/transitions file: the first document is accepted, the second refused."""
    first, second = (doc for doc in yaml.safe_load_all(example.read_text()) if doc)
    message = _apply_transition(kube, namespace, first, second, first["metadata"]["name"])
    assert _expected_error(example) in message, message


def test_growth_is_accepted(kube: Kube, crd: dict[str, Any], namespace: str) -> None:
    """The counterpart of the shrink rule: growing brokers is a valid update (slotAmount is
    immutable until resharding exists; test_invalid_transition_is_rejected[slot-growth])."""
    kube.apply(delay_topic("grow", slotAmount=64, brokers=1), namespace)
    kube.apply(delay_topic("grow", slotAmount=64, brokers=4), namespace)
    stored = kube.get("dt", "grow", namespace)
    assert stored is not None
    assert (stored["spec"]["slotAmount"], stored["spec"]["brokers"]) == (64, 4)
    assert stored["metadata"]["generation"] == 2


def test_printer_columns_and_status_subresource(
    kube: Kube, crd: dict[str, Any], namespace: str
) -> None:
    """``kubectl get dt`` shows the printer columns; status is stored through its subresource.

    Unowned slots, scheduled and dead messages (and, wide, the applied slots) come from status.

    A status write must not bump ``metadata.generation`` (that is what makes
    ``status.observedGeneration == generation`` a meaningful "reconciled" signal).
    """
    kube.apply(delay_topic("orders", slotAmount=64, brokers=2, topicType="pull"), namespace)
    table = kube.kubectl("get", "dt", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "SLOTS", "TYPE", "BROKERS", "READY", "UNOWNED",
                                "SCHEDULED", "DEAD", "AGE"]
    assert table[1].split()[:4] == ["orders", "64", "pull", "2"]

    generation = kube.get("dt", "orders", namespace)["metadata"]["generation"]  # type: ignore[index]
    status = {"status": {"observedGeneration": generation, "conditions": [{
        "type": "Ready", "status": "True", "reason": "AllBrokersReady",
        "message": "2/2 brokers ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}, {
        "type": "Resharding", "status": "True", "reason": "MovingSlots",
        "message": "2/8 slot moves done", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "appliedSlotAmount": 64, "slots": {"total": 64, "owned": 61, "unowned": 3},
        "depths": {"scheduled": 1234, "prepared": 5, "dead": 7}, "paused": True}}
    kube.kubectl("patch", "dt", "orders", "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps(status))
    stored = kube.get("dt", "orders", namespace)
    assert stored is not None
    assert stored["status"]["observedGeneration"] == generation
    assert stored["metadata"]["generation"] == generation
    assert condition(stored, "Ready") == "True"

    table = kube.kubectl("get", "dt", "orders", "-n", namespace).stdout.splitlines()
    assert table[1].split()[:8] == ["orders", "64", "pull", "2", "True", "3", "1234", "7"]

    wide = kube.kubectl("get", "dt", "orders", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "SLOTS", "APPLIED", "TYPE", "BROKERS", "READY", "REASON",
                               "UNOWNED", "PAUSED", "RESHARDING", "SCHEDULED", "DEAD", "AGE"]
    assert wide[1].split()[:12] == ["orders", "64", "64", "pull", "2", "True", "AllBrokersReady",
                                    "3", "true", "MovingSlots", "1234", "7"]
