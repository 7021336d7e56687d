"""Real server processes (redis-server, ZooKeeper) on loopback, for tests and `delayq dev`."""
