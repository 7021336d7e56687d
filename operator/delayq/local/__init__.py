"""Real server processes (redis-server, ZooKeeper) started on loopback for tests and `delayq dev`."""
