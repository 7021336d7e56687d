"""The delayq Kubernetes operator: DelayTopic CRD handlers, pure manifest builders, failover."""
