"""TLS to ZooKeeper, on a real ensemble with a TLS client port (`secureClientPort`, Netty).

The PKI is made here with `openssl` (a CA, the server's certificate for 127.0.0.1, a client
certificate) and Java's `keytool` (the server's truststore); the server is the project's
launcher (delayq.local.zookeeper_server) with the TLS settings in its zoo.cfg. It asks clients
for a certificate without requiring one (`ssl.clientAuth=want`, what delay-service pods need:
they present none), so a presented certificate must be the CA's.

The operator's store and a delay service, configured as on Kubernetes (the CA file, the
topic's digest login), reach the topic's ACL'd tree; a client without the CA, a plain client
and one presenting a certificate of another CA are refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from delayq.coordination.acl import ADMIN_USER, ZkIdentity
from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import initial_routing
from delayq.coordination.tls import ZkTls, kazoo_options
from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
from delayq.kube import naming
from delayq.kube.builders.common import BuildContext
from delayq.kube.builders.service import config_hash, config_json, config_map
from delayq.kube.config import OperatorConfig
from delayq.kube.spec import parse_spec
from delayq.kube.zk import KazooTopicStore
from delayq.local.ports import free_port
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.service.config import ConfigError, ServiceConfig
from delayq.service.topic_file import TopicFile
from tests.routing_support import read_routing

pytestmark = pytest.mark.timeout(180)

NAMESPACE, TOPIC, SLOTS = "secure", "orders", 4
ADMIN_PASSWORD, TOPIC_PASSWORD = "admin-secret", "topic-secret"
STORE_PASSWORD = "changeit"  # of the server's keystore and truststore (test-only files)
REFUSED_TIMEOUT_S = 3.0  # how long a refused client keeps retrying before it gives up


@dataclass(frozen=True)
class Pki:
    directory: Path

    def __call__(self, name: str) -> str:
        """The path of one of its files."""
        return str(self.directory / name)


def _run(directory: Path, *command: str) -> None:
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"


def _signed(pki: Path, name: str, subject: str, extensions: str, ca: str = "ca") -> None:
    """`<name>.key` and `<name>.crt`, signed by `<ca>.crt`."""
    (pki / f"{name}.ext").write_text(extensions + "\n")
    _run(
        pki,
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
    )
    _run(
        pki,
        "openssl",
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
    )


def _self_signed(pki: Path, name: str) -> None:
    _run(
        pki,
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("zookeeper-pki")
    _self_signed(directory, "ca")
    _self_signed(directory, "rogue")  # another CA's certificate, for a client
    _signed(
        directory,
        "server",
        "/CN=zookeeper",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
    )
    _signed(directory, "client", "/CN=delayq-operator", "extendedKeyUsage=clientAuth")
    _run(
        directory,
        "openssl",
        "pkcs12",
        "-export",
        "-in",
        "server.crt",
        "-inkey",
        "server.key",
        "-certfile",
        "ca.crt",
        "-out",
        "keystore.p12",
        "-passout",
        f"pass:{STORE_PASSWORD}",
    )
    _run(
        directory,
        "keytool",
        "-importcert",
        "-noprompt",
        "-alias",
        "ca",
        "-file",
        "ca.crt",
        "-keystore",
        "truststore.p12",
        "-storetype",
        "PKCS12",
        "-storepass",
        STORE_PASSWORD,
    )
    return Pki(directory)


@pytest.fixture(scope="module")
def secure_hosts(pki: Pki) -> Iterator[str]:
    """The connection string of a real ZooKeeper's TLS client port."""
    port = free_port()
    server = ZooKeeperServer(
        extra_config={
            "secureClientPort": str(port),
            "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
            "ssl.keyStore.location": pki("keystore.p12"),
            "ssl.keyStore.password": STORE_PASSWORD,
            "ssl.trustStore.location": pki("truststore.p12"),
            "ssl.trustStore.password": STORE_PASSWORD,
            "ssl.clientAuth": "want",
        }
    )
    try:
        server.start()
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()  # also after a failed start: the process may be running


@pytest.fixture
async def operator_store(pki: Pki, secure_hosts: str) -> AsyncIterator[KazooTopicStore]:
    """The operator's store as the chart configures it: the CA and its client certificate."""
    tls = ZkTls(pki("ca.crt"), pki("client.crt"), pki("client.key"))
    store = KazooTopicStore([secure_hosts], admin_password=ADMIN_PASSWORD, tls=tls)
    yield store
    await asyncio.to_thread(store.close)


def service_config(hosts: str, pki: Pki) -> ServiceConfig:
    """A delay service as topic.json and the pod's environment configure it (no client cert)."""
    return ServiceConfig(
        namespace=NAMESPACE,
        topic=TOPIC,
        slot_amount=SLOTS,
        zookeeper_connect=hosts,
        zookeeper_password=TOPIC_PASSWORD,
        zookeeper_admin_acl=ZkIdentity(ADMIN_USER, ADMIN_PASSWORD).acl_id,
        zookeeper_tls=True,
        zookeeper_tls_ca_file=pki("ca.crt"),
    )


async def test_the_operator_and_a_service_reach_the_acled_tree_over_tls(
    secure_hosts: str, pki: Pki, operator_store: KazooTopicStore
) -> None:
    routing = initial_routing(SLOTS, 2)
    await operator_store.publish(secure_hosts, NAMESPACE, TOPIC, routing, TOPIC_PASSWORD)
    config = service_config(secure_hosts, pki)
    tls = config.zookeeper_client_tls
    assert tls == ZkTls(pki("ca.crt"))
    identity = config.zookeeper_identity
    assert await read_routing(secure_hosts, NAMESPACE, TOPIC, SLOTS, identity, tls) == list(
        routing.broker_of_slot
    )
    member = ZkOwnership(
        ZkSettings(
            hosts=secure_hosts,
            namespace=NAMESPACE,
            topic=TOPIC,
            slot_amount=SLOTS,
            member_id=f"{TOPIC}-0",
            session_timeout_s=4.0,
            identity=identity,
            admin_acl_id=config.zookeeper_admin_acl,
            tls=tls,
        )
    )

    async def on_change(slots: frozenset[int]) -> None:
        return None

    await member.start(on_change)
    try:
        await eventually(lambda: len(member.owned) == SLOTS, 15.0, "every slot owned over TLS")
        assert await operator_store.owned_slots(secure_hosts, NAMESPACE, TOPIC) == SLOTS
    finally:
        await member.stop()
    # TLS encrypts; the ACLs still decide: a stranger with the CA reads nothing
    stranger = KazooClient(hosts=secure_hosts, **kazoo_options(ZkTls(pki("ca.crt"))))
    stranger.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            stranger.get(TopicPaths(NAMESPACE, TOPIC).routing)
    finally:
        stranger.stop()
        stranger.close()


def untrusted(kind: str, pki: Pki) -> ZkTls | None:
    """A client the ensemble cannot trust, or that cannot trust the ensemble."""
    return {
        "without-the-ca": ZkTls(),  # the system CAs only
        "plain": None,
        "another-cas-cert": ZkTls(pki("ca.crt"), pki("rogue.crt"), pki("rogue.key")),
    }[kind]


@pytest.mark.parametrize("kind", ["without-the-ca", "plain", "another-cas-cert"])
async def test_a_client_the_ensemble_or_the_client_cannot_trust_is_refused(
    secure_hosts: str, pki: Pki, kind: str
) -> None:
    store = KazooTopicStore(
        [secure_hosts],
        timeout_s=REFUSED_TIMEOUT_S,
        admin_password=ADMIN_PASSWORD,
        tls=untrusted(kind, pki),
    )
    try:
        with pytest.raises(TimeoutError):  # kazoo retries the handshake until it gives up
            await store.read_routing(secure_hosts, NAMESPACE, TOPIC)
    finally:
        await asyncio.to_thread(store.close)


async def test_without_verification_the_connection_is_encrypted_but_trusts_anyone(
    secure_hosts: str,
) -> None:
    """verify_certs off: no CA needed (and none checked): for trying things out only."""
    store = KazooTopicStore(
        [secure_hosts], admin_password=ADMIN_PASSWORD, tls=ZkTls(verify_certs=False)
    )
    try:
        await store.read_routing(secure_hosts, NAMESPACE, "unpublished")
    finally:
        await asyncio.to_thread(store.close)


# --- the settings, from the operator's environment to the pods (pure) -------------------------


def test_the_operator_reads_its_tls_settings_and_ca_from_the_environment(pki: Pki) -> None:
    assert OperatorConfig.from_env({}).zookeeper_tls is None
    env = {
        "DELAYQ_ZOOKEEPER_TLS": "true",
        "DELAYQ_ZOOKEEPER_TLS_CA_FILE": pki("ca.crt"),
        "DELAYQ_ZOOKEEPER_TLS_CERT_FILE": pki("client.crt"),
        "DELAYQ_ZOOKEEPER_TLS_KEY_FILE": pki("client.key"),
    }
    config = OperatorConfig.from_env(env)
    assert config.zookeeper_tls == ZkTls(pki("ca.crt"), pki("client.crt"), pki("client.key"))
    build = config.build
    assert build.zookeeper_tls
    assert build.zookeeper_tls_verify_certs
    assert build.zookeeper_tls_ca_pem == Path(pki("ca.crt")).read_text()
    unverified = {"DELAYQ_ZOOKEEPER_TLS": "true", "DELAYQ_ZOOKEEPER_TLS_VERIFY_CERTS": "false"}
    assert OperatorConfig.from_env(unverified).zookeeper_tls == ZkTls(verify_certs=False)
    with pytest.raises(ValueError, match=r"DELAYQ_ZOOKEEPER_TLS_CA_FILE=/nowhere/ca\.crt"):
        OperatorConfig.from_env({**env, "DELAYQ_ZOOKEEPER_TLS_CA_FILE": "/nowhere/ca.crt"})
    with pytest.raises(ValueError, match="VERIFY_CERTS must be true or false, not 'flase'"):
        OperatorConfig.from_env({**env, "DELAYQ_ZOOKEEPER_TLS_VERIFY_CERTS": "flase"})
    with pytest.raises(ValueError, match="needs its key"):
        OperatorConfig.from_env({**env, "DELAYQ_ZOOKEEPER_TLS_KEY_FILE": ""})


def test_service_pods_get_the_ca_next_to_topic_json_and_roll_when_it_changes() -> None:
    spec = parse_spec("orders", "shop", {})
    plain = BuildContext()
    secure = BuildContext(zookeeper_tls=True, zookeeper_tls_ca_pem="-----BEGIN CERTIFICATE-----")
    assert naming.ZOOKEEPER_CA_KEY not in config_map(spec, plain, 8)["data"]
    data = config_map(spec, secure, 8)["data"]
    assert data[naming.ZOOKEEPER_CA_KEY] == secure.zookeeper_tls_ca_pem
    settings = TopicFile.from_json(data[naming.CONFIG_KEY]).service_settings({})
    config = ServiceConfig(**settings, zookeeper_password=TOPIC_PASSWORD)
    # the ConfigMap is mounted at CONFIG_MOUNT: the CA file is the copy above
    assert config.zookeeper_client_tls == ZkTls(f"{naming.CONFIG_MOUNT}/zookeeper-ca.crt")
    plain_settings = TopicFile.from_json(config_json(spec, plain, 8)).service_settings({})
    assert ServiceConfig(**plain_settings).zookeeper_client_tls is None
    rotated = dataclasses.replace(secure, zookeeper_tls_ca_pem="-----BEGIN CERTIFICATE-----2")
    assert config_hash(spec, rotated, 8) != config_hash(spec, secure, 8)
    system_cas = dataclasses.replace(
        secure, zookeeper_tls_ca_pem="", zookeeper_tls_verify_certs=False
    )
    settings = TopicFile.from_json(config_json(spec, system_cas, 8)).service_settings({})
    assert ServiceConfig(**settings).zookeeper_client_tls == ZkTls(verify_certs=False)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"zookeeper_tls_ca_file": "/ca.crt"}, "--zookeeper-tls-ca-file .* needs --zookeeper-tls"),
        (
            {"zookeeper_tls": True, "zookeeper_tls_cert_file": "/c.crt"},
            "--zookeeper-tls-cert-file .* and --zookeeper-tls-key-file .* go together",
        ),
    ],
)
def test_serve_refuses_half_a_tls_setting(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServiceConfig(zookeeper_connect="zk:2281", **settings)  # type: ignore[arg-type]
