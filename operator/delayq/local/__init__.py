"""Local clusters of real processes on loopback, for tests, benchmarks and `delayq dev`.

redis-server and ZooKeeper launchers, `delayq serve` processes stopped by PID, and the
`delayq dev` quick start. It sits beside the operator and the pipeline: it may use the delay
service and what lies below it, and only the `delayq` command (and tests) use it.
"""
