"""The operator's configuration from its environment."""

from __future__ import annotations

from delayq.kube.config import OperatorConfig


def test_operator_config_from_env() -> None:
    config = OperatorConfig.from_env(
        {
            "DELAYQ_WATCH_NAMESPACES": "a, b,",
            "DELAYQ_STANDALONE": "true",
            "DELAYQ_ZOOKEEPER": "zk:2181",
            "POD_NAMESPACE": "ops",
            "DELAYQ_FAILOVER_GRACE_S": "5",
        }
    )
    assert config.namespaces == ("a", "b")
    assert not config.clusterwide
    assert config.standalone
    assert config.build.default_zookeeper == "zk:2181"
    assert config.build.operator_namespace == "ops"
    assert config.failover_grace_s == 5.0
    assert OperatorConfig.from_env({}).clusterwide
