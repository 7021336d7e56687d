"""Pure manifest builders: a TopicSpec in, plain dicts out; no I/O, tested without a cluster."""
