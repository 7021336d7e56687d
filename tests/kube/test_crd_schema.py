"""The CRD: one source of truth, a structural schema that accepts/rejects the examples.

CEL rules run only on a real API server (the e2e suite applies the same examples there); here
every invalid example must be rejected by the OpenAPI schema or by the operator's own parser,
which repeats each non-transition CEL rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from delayq.kube.builders.bundle import build_all
from delayq.kube.builders.common import BuildContext, Credentials
from delayq.kube.crd_schema import generate
from delayq.kube.spec import (
    ALLOW_FROM_EMPTY_PEER_MESSAGE,
    ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE,
    MAX_ALLOW_FROM,
    MAX_TOPIC_NAME_LENGTH,
    NAME_NOT_DNS_1035_MESSAGE,
    NAME_TOO_LONG_MESSAGE,
    SECRET_KEY_MESSAGE,
    SECRET_KEY_PATTERN,
    SECRET_NAME_MESSAGE,
    SECRET_NAME_PATTERN,
    STREAM_KEY_ENGINE_MESSAGE,
    STREAM_KEY_ENGINE_RULE,
    WEBHOOK_HTTPS_MESSAGE,
    WEBHOOK_URL_SECRET_MESSAGE,
    WEBHOOK_URL_SECRET_PATTERN,
    WEBHOOK_URL_SOURCE_MESSAGE,
    SpecError,
    TopicSpec,
    parse_duration_ms,
    parse_spec,
)
from delayq.queue.keys import ENGINE_KEY_PREFIXES
from delayq.queue.settings import MAX_BROKERS, MAX_REPLICAS_PER_BROKER, RULES, SETTINGS
from delayq.queue.topic import MAX_SLOT_AMOUNT, TopicType

#: The messages of the rules between replica counts (the table's RULES, by offending setting).
MIN_REPLICAS_EXCEED_MESSAGE = next(
    r.message for r in RULES if r.names[0] == "redis_min_replicas_to_write"
)
SYNC_REPLICAS_EXCEED_MESSAGE = next(r.message for r in RULES if r.names[0] == "redis_sync_replicas")

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "delaytopics.delayq.io.yaml"
CHART_CRD_PATH = ROOT / "charts" / "delayq" / "crds" / "delaytopics.delayq.io.yaml"
EXAMPLES = ROOT / "examples"


def crd() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


def root_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def spec_schema() -> dict[str, Any]:
    spec: dict[str, Any] = root_schema()["properties"]["spec"]
    return spec


def openapi_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return to_jsonschema(schema)


def to_jsonschema(node: Any) -> Any:
    """Drop Kubernetes-only keywords (x-kubernetes-*) so jsonschema sees plain OpenAPI v3."""
    if isinstance(node, dict):
        return {k: to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if isinstance(node, list):
        return [to_jsonschema(item) for item in node]
    return node


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(openapi_schema())
    return [error.message for error in validator.iter_errors(document)]


def expected_error(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect-error: "), f"{path} must start with # expect-error:"
    return first.removeprefix("# expect-error: ")


def parser_error(document: dict[str, Any]) -> str | None:
    meta = document["metadata"]
    try:
        parse_spec(meta["name"], meta.get("namespace", "default"), document.get("spec") or {})
    except SpecError as error:
        return str(error)
    return None


def test_chart_copy_is_byte_identical() -> None:
    assert CHART_CRD_PATH.read_bytes() == CRD_PATH.read_bytes(), (
        "charts/delayq/crds/ must be a copy of crds/: cp crds/*.yaml charts/delayq/crds/"
    )


def test_the_checked_in_crd_is_the_generated_one() -> None:
    """The settings' schema comes from the settings table (delayq.kube.crd_schema): a row
    changed without regenerating, or a hand edit of a generated part, fails here."""
    assert CRD_PATH.read_text() == generate(), (
        "crds/ is stale: python -m delayq.kube.crd_schema > crds/delaytopics.delayq.io.yaml "
        "&& cp crds/*.yaml charts/delayq/crds/"
    )


def test_names_scope_and_printer_columns() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "delayq.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "DelayTopic"
    assert spec["names"]["plural"] == "delaytopics"
    assert spec["names"]["shortNames"] == ["dt"]
    assert spec["names"]["categories"] == ["delayq"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}


#: `kubectl get dt` (priority 0) and `-o wide` (priority 1), in order, with their sources.
PRINTER_COLUMNS = [
    ("Slots", ".spec.slotAmount", 0),
    ("Applied", ".status.appliedSlotAmount", 1),
    ("Type", ".spec.topicType", 0),
    ("Brokers", ".spec.brokers", 0),
    ("Ready", '.status.conditions[?(@.type=="Ready")].status', 0),
    ("Reason", '.status.conditions[?(@.type=="Ready")].reason', 1),
    ("Unowned", ".status.slots.unowned", 0),
    ("Paused", ".status.paused", 1),
    ("Resharding", '.status.conditions[?(@.type=="Resharding")].reason', 1),
    ("Scheduled", ".status.depths.scheduled", 0),
    ("Dead", ".status.depths.dead", 0),
    ("Age", ".metadata.creationTimestamp", 0),
]


def test_printer_columns_show_what_is_served_from_status() -> None:
    """Applied slots, unowned slots, scheduled and dead come from status fields the schema
    declares (and the operator writes: status.py / the health loop), not from the spec."""
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in columns] == PRINTER_COLUMNS
    for column in columns:
        path = column["jsonPath"]
        if "[" in path or path.startswith(".metadata"):
            continue
        node: dict[str, Any] = root_schema()
        for part in path.strip(".").split("."):
            assert part in node.get("properties", {}), f"{path} is not in the schema"
            node = node["properties"][part]
        assert node["type"] == column["type"], path
        if column["name"] != "Age":
            assert column.get("description"), column["name"]


def test_every_property_is_described() -> None:
    """`kubectl explain dt.spec...` shows a description for every field. The root metadata is
    the one exception: the API server forbids a description there (only name/generateName)."""
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, child in node.get("properties", {}).items():
            where = f"{path}.{name}" if path else name
            if not child.get("description") and where != "metadata":
                missing.append(where)
            walk(child, where)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    schema = root_schema()
    assert schema.get("description")
    walk(schema, "")
    assert missing == []
    assert "description" not in schema["properties"]["metadata"]
    assert set(schema["properties"]["metadata"]["properties"]) <= {"name", "generateName"}


def walk_rules(node: Any) -> list[dict[str, str]]:
    rules: list[dict[str, str]] = []
    if isinstance(node, dict):
        rules += node.get("x-kubernetes-validations", [])
        for value in node.values():
            rules += walk_rules(value)
    elif isinstance(node, list):
        for item in node:
            rules += walk_rules(item)
    return rules


def test_every_cel_rule_has_a_message() -> None:
    rules = walk_rules(crd())
    assert len(rules) >= 10
    for rule in rules:
        assert len(rule.get("message", "")) > 20, rule


def test_message_expressions_say_the_message_and_add_the_values() -> None:
    """A messageExpression is the static message plus the offending values, so the examples'
    expect-error texts (a prefix of the message) match both, and the fallback says the same.
    Only the slotAmount transition rule words shrink and growth differently.

    Numbers go through `'...%d'.format([...])`, never `string(n)` or `+` after a format: the
    API server estimates `string(int)` and concatenations with a formatted string as unbounded
    and refuses the whole CRD (found on kube-apiserver v1.33)."""
    with_expression = [rule for rule in walk_rules(crd()) if "messageExpression" in rule]
    assert len(with_expression) >= 8
    for rule in with_expression:
        expression = rule["messageExpression"]
        assert "string(" not in expression, expression
        assert ") +" not in expression, expression
        assert expression.count("'") % 2 == 0, expression
        assert "self" in expression, expression
        assert expression.startswith("'" + rule["message"] + " ("), expression


def resolves(schema: dict[str, Any], field_path: str) -> bool:
    node = schema
    for part in field_path.strip(".").split("."):
        if part not in node.get("properties", {}):
            return False
        node = node["properties"][part]
    return True


def test_spec_rules_point_at_the_offending_field() -> None:
    """Every spec-level rule names its field (fieldPath), so kubectl reports spec.brokers
    rather than spec; the path must exist in the schema or the API server refuses the CRD."""
    rules = spec_schema()["x-kubernetes-validations"]
    assert len(rules) == 8
    for rule in rules:
        assert resolves(spec_schema(), rule["fieldPath"]), rule
    by_path = {rule["fieldPath"]: rule for rule in rules}
    assert by_path[".brokers"]["messageExpression"].endswith(
        "(brokers=%d, slotAmount=%d)'.format([self.brokers, self.slotAmount])"
    )
    minimum = by_path[".redis.minReplicasToWrite"]
    assert minimum["message"] == MIN_REPLICAS_EXCEED_MESSAGE
    assert by_path[".redis.syncReplicas"]["message"] == SYNC_REPLICAS_EXCEED_MESSAGE
    for rule in root_schema()["x-kubernetes-validations"]:
        assert rule["fieldPath"] == ".metadata.name"
        assert resolves(root_schema(), rule["fieldPath"])


def longest_valid_topic_name() -> int:
    """The longest name for which every object the builders make at the CRD's maxima
    (64 brokers, 5 replicas each, every slot), for every topic type (a stream topic adds its
    reader's Secret and policy), has a valid name: at most 63 characters, a
    DNS-1035 label for Services, StatefulSets at most 52 (the controller-revision-hash label
    is `<statefulset>-<hash of up to 10>`), and each StatefulSet pod `<statefulset>-<ordinal>`
    at most 63 (its hostname and `statefulset.kubernetes.io/pod-name` label)."""
    dns_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    ctx = BuildContext(image="delayq:test", redis_image="redis:test")
    longest = 0
    for length in range(1, 64):
        credentials = Credentials("pw", "tok", "zk", "admin", "viewer", "scraper", "lk", "op")
        manifests = [
            manifest
            for topic_type in TopicType
            for manifest in build_all(
                TopicSpec(
                    name="t" * length,
                    namespace="shop",
                    slot_amount=MAX_SLOT_AMOUNT,
                    topic_type=topic_type,
                    brokers=MAX_BROKERS,
                    replicas_per_broker=MAX_REPLICAS_PER_BROKER,
                ),
                ctx,
                credentials,
                MAX_SLOT_AMOUNT,
                True,
            )
        ]
        valid = True
        for manifest in manifests:
            name = manifest["metadata"]["name"]
            labels = list(manifest["metadata"].get("labels", {}).values())
            valid &= len(name) <= 63 and bool(dns_1035.match(name))
            valid &= all(len(str(value)) <= 63 for value in labels)
            if manifest["kind"] == "StatefulSet":
                last_pod = f"{name}-{manifest['spec']['replicas'] - 1}"
                valid &= len(name) <= 52 and len(last_pod) <= 63
        if not valid:
            break
        longest = length
    return longest


def test_the_name_bound_is_derived_from_the_builders() -> None:
    """43 today: <name>-redis-63 is the longest StatefulSet. The CRD rule, its message and the
    parser's constant all carry the same number, so they cannot drift from the builders."""
    assert longest_valid_topic_name() == MAX_TOPIC_NAME_LENGTH == 43
    length_rule, pattern_rule = root_schema()["x-kubernetes-validations"]
    assert length_rule["rule"] == (
        f"oldSelf.hasValue() || self.metadata.name.size() <= {MAX_TOPIC_NAME_LENGTH}"
    )
    assert length_rule["message"] == NAME_TOO_LONG_MESSAGE
    assert pattern_rule["rule"] == (
        "oldSelf.hasValue() || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
    )
    assert pattern_rule["message"] == NAME_NOT_DNS_1035_MESSAGE


def test_allow_from_peer_rules_are_the_parsers() -> None:
    """Each networkPolicy.allowFrom entry: the CEL rules (what kubectl shows) and the parser
    (InvalidSpec where CEL did not run) refuse the same peers with the same words."""
    allow_from = spec_schema()["properties"]["networkPolicy"]["properties"]["allowFrom"]
    assert allow_from["maxItems"] == MAX_ALLOW_FROM
    rules = allow_from["items"]["x-kubernetes-validations"]
    assert [rule["message"] for rule in rules] == [
        ALLOW_FROM_EMPTY_PEER_MESSAGE,
        ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE,
    ]
    peer = allow_from["items"]["properties"]
    assert set(peer) == {"namespaceSelector", "podSelector", "ipBlock"}


def webhook_schema() -> dict[str, Any]:
    webhook: dict[str, Any] = spec_schema()["properties"]["delivery"]["properties"]["webhook"]
    return webhook


def test_the_https_rule_is_the_parsers_and_spares_a_stored_http_url() -> None:
    """https unless allowInsecureHttp, with the parser's words, at the url. A topic stored with
    an http url before the rule existed keeps taking status patches (optionalOldSelf), so the
    operator can still say InvalidSpec; a changed url is checked."""
    https, secret, source = webhook_schema()["x-kubernetes-validations"]
    assert https["message"] == WEBHOOK_HTTPS_MESSAGE
    assert "messageExpression" not in https  # it would repeat a url holding a credential
    assert https["rule"].startswith("!has(self.url) || self.url.startsWith('https://') || ")
    assert secret["message"] == WEBHOOK_URL_SECRET_MESSAGE
    assert f"!self.url.matches('{WEBHOOK_URL_SECRET_PATTERN}')" in secret["rule"]
    for rule in (https, secret):
        assert rule["fieldPath"] == ".url"
        assert rule["optionalOldSelf"] is True
        assert rule["rule"].endswith(
            "(oldSelf.hasValue() && has(oldSelf.value().url) && oldSelf.value().url == self.url)"
        )
    assert source == {
        "rule": "has(self.url) != has(self.urlSecretRef)",
        "message": WEBHOOK_URL_SOURCE_MESSAGE,
    }
    assert webhook_schema()["properties"]["allowInsecureHttp"]["default"] is False


@pytest.mark.parametrize(
    "url",
    [
        "https://shop:hunter2@hooks.example.com/h",
        "https://hunter2@hooks.example.com/h",
        "https://hooks.example.com/h?token=hunter2",
        "https://hooks.example.com/?hunter2",
    ],
)
def test_a_url_with_a_credential_is_refused_and_never_repeated(url: str) -> None:
    """The URL is written into the ConfigMap: credentials go in Secrets; neither the CEL
    rule's regex nor the parser's InvalidSpec lets one through, nor repeats it."""
    assert re.match(WEBHOOK_URL_SECRET_PATTERN, url)
    spec = {"topicType": "webhook", "delivery": {"webhook": {"url": url}}}
    with pytest.raises(SpecError) as raised:
        parse_spec("hooks", "shop", spec)
    assert str(raised.value) == WEBHOOK_URL_SECRET_MESSAGE
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("url", ["https://hooks.example.com/a@b", "https://h.example/x#y"])
def test_a_url_without_credentials_passes_the_rule(url: str) -> None:
    assert not re.match(WEBHOOK_URL_SECRET_PATTERN, url)


def test_an_http_url_is_named_without_its_path_in_invalid_spec() -> None:
    spec = {"topicType": "webhook", "delivery": {"webhook": {"url": "http://h.example/hunter2"}}}
    with pytest.raises(SpecError) as raised:
        parse_spec("hooks", "shop", spec)
    assert str(raised.value) == f"{WEBHOOK_HTTPS_MESSAGE} (url=http://h.example/…)"


def test_the_stream_key_rule_is_the_parsers_and_covers_the_engines_key_space() -> None:
    """The CEL rule on streamKey is built from `keys.ENGINE_KEY_PREFIXES` (one per prefix)
    and says the parser's words."""
    stream = spec_schema()["properties"]["delivery"]["properties"]["stream"]
    (rule,) = stream["properties"]["streamKey"]["x-kubernetes-validations"]
    assert rule == {"rule": STREAM_KEY_ENGINE_RULE, "message": STREAM_KEY_ENGINE_MESSAGE}
    assert all(f"'{prefix}'" in rule["rule"] for prefix in ENGINE_KEY_PREFIXES)


@pytest.mark.parametrize("field", ["signingSecretRef", "extraHeadersSecretRef", "urlSecretRef"])
def test_secret_references_check_what_kubernetes_checks_with_the_parsers_words(field: str) -> None:
    ref = webhook_schema()["properties"][field]
    assert ref["required"] == ["name", "key"]
    for part, pattern, message in (
        ("name", SECRET_NAME_PATTERN, SECRET_NAME_MESSAGE),
        ("key", SECRET_KEY_PATTERN, SECRET_KEY_MESSAGE),
    ):
        (rule,) = ref["properties"][part]["x-kubernetes-validations"]
        cel_literal = pattern.pattern.replace("\\", "\\\\")  # CEL strings escape a backslash
        assert rule == {"rule": f"self.matches('{cel_literal}')", "message": message}
        assert ref["properties"][part]["maxLength"] == 253


def test_the_name_rules_run_on_create_only() -> None:
    """A name never changes, so checking it on create is enough; evaluating the root rule on
    every update would make the API server refuse status patches (and labels, finalizers) of a
    topic created before the rule existed, so the operator could not even say InvalidSpec."""
    for rule in root_schema()["x-kubernetes-validations"]:
        assert rule["optionalOldSelf"] is True
        assert rule["rule"].startswith("oldSelf.hasValue() || ")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("t" * 44, f"{NAME_TOO_LONG_MESSAGE} (length=44)"),
        ("orders.eu", f"{NAME_NOT_DNS_1035_MESSAGE} (name=orders.eu)"),
        ("1orders", f"{NAME_NOT_DNS_1035_MESSAGE} (name=1orders)"),
    ],
)
def test_the_parser_repeats_the_name_rules(name: str, expected: str) -> None:
    """What the CEL messageExpression prints, the operator's InvalidSpec says too."""
    with pytest.raises(SpecError) as raised:
        parse_spec(name, "shop", {})
    assert str(raised.value) == expected


def test_a_name_at_the_bound_is_accepted() -> None:
    assert parse_spec("t" * MAX_TOPIC_NAME_LENGTH, "shop", {}).name == "t" * 43


def test_transition_rules_cover_immutability_and_growth() -> None:
    properties = spec_schema()["properties"]
    assert {"rule": "self == oldSelf"}.items() <= properties["topicType"][
        "x-kubernetes-validations"
    ][0].items()
    assert any(
        r["rule"] == "self >= oldSelf" for r in properties["brokers"]["x-kubernetes-validations"]
    )


def test_slot_amount_only_grows() -> None:
    """Growth doubles the slots live (the operator splits them); shrinking is refused at the
    API server, since the removed slots would still hold messages."""
    rules = spec_schema()["properties"]["slotAmount"]["x-kubernetes-validations"]
    transitions = [rule for rule in rules if "oldSelf" in rule["rule"]]
    assert [rule["rule"] for rule in transitions] == ["self >= oldSelf"]
    assert transitions[0]["message"].startswith("slotAmount may grow but never shrink")


def test_every_number_is_bounded() -> None:
    def check(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer" and not path.startswith("status"):
                assert {"minimum", "maximum"} <= node.keys(), path
            for key, value in node.get("properties", {}).items():
                check(value, f"{path}.{key}" if path else key)

    check(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


@pytest.mark.parametrize("path", sorted((EXAMPLES / "valid").glob("*.yaml")), ids=lambda p: p.stem)
def test_valid_examples_pass_schema_and_parser(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    assert schema_errors(document) == []
    assert parser_error(document) is None


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.stem
)
def test_invalid_examples_are_rejected(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    errors = schema_errors(document)
    from_parser = parser_error(document)
    assert errors or from_parser, f"{path.name} was accepted by both the schema and the parser"
    expected = expected_error(path)
    if from_parser and not expected.startswith("spec."):
        # The parser repeats the CEL rule, so its message must be the one kubectl shows.
        assert expected in from_parser


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "transitions").glob("*.yaml")), ids=lambda p: p.stem
)
def test_transition_examples_are_individually_valid(path: Path) -> None:
    """Each side is valid alone; only the change is rejected (by a CEL transition rule)."""
    before, after = yaml.safe_load_all(path.read_text())
    assert before["metadata"]["name"] == after["metadata"]["name"]
    for document in (before, after):
        assert schema_errors(document) == []
        assert parser_error(document) is None
    message = expected_error(path)
    assert any(rule["message"].startswith(message) for rule in walk_rules(crd()))


def crd_defaults(properties: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every `default:` under the spec, by its dotted path (`delivery.webhook.timeout`)."""
    found: dict[str, Any] = {}
    for name, node in properties.items():
        path = f"{prefix}{name}"
        if "default" in node:
            found[path] = node["default"]
        found.update(crd_defaults(node.get("properties", {}), f"{path}."))
    return found


def test_every_crd_default_is_the_one_of_the_defaults_table() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    in_crd = crd_defaults(spec["properties"])
    table = {row.path: row for row in SETTINGS}
    assert sorted(in_crd) == sorted(table)
    for path, value in in_crd.items():
        row = table[path]
        if row.name.endswith("_ms"):
            assert parse_duration_ms(value, path, 0, 10**9) == row.default, path
        assert value == row.crd_default(), path


def test_the_parser_defaults_an_empty_spec_from_the_table() -> None:
    """TopicSpec's names are the table's (one name per setting), so every default matches."""
    parsed = parse_spec("orders", "shop", {})
    for row in SETTINGS:
        where = parsed.delivery if hasattr(parsed.delivery, row.name) else parsed
        assert getattr(where, row.name) == row.default, row.name
