"""The chaos suite: real redis-server, ZooKeeper and `delayq serve` processes under seeded faults.

`run.run_chaos` is the one entry point: `test_chaos.py` calls it with short bounded plans and
`bench/chaos.py` with a long soak; `test_pace.py` drives the same fleet with a rate limit
through its own faults (the rate limit and a receiver's hold through kill -9). Modules: `proxy`
(freezable and cuttable TCP links), `cluster` (the processes, each behind its own links),
`receiver` (the webhook that records every POST), `producer` (HTTP batch scheduling), `faults`
(the menu, the seeded plan, injection), `probes` (readiness against ZooKeeper's grants, slot
samples), `unplanned` (the faults nobody injected: own session losses, exits, stalls), `checker`
(the rules, pure).
"""
