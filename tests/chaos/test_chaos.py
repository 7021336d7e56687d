"""The chaos suite in CI: real redis-server, ZooKeeper and three `delayq serve` processes (two
with skewed clocks) under seeded, overlapping faults; the checker's rules must all hold.

Each seed's plan holds every fault kind of the menu at least once. A failure prints the seed
(rerun it with `python3 bench/chaos.py --minutes 1 --seed N`), every broken rule with examples,
and where the process logs were kept.
"""

from __future__ import annotations

import json

import pytest

from .run import ChaosOptions, run_chaos

SEEDS = (11, 23)
FAULT_PHASE_S = 60.0

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", SEEDS)
async def test_seeded_faults_break_no_rule(seed: int) -> None:
    result = await run_chaos(ChaosOptions(seed=seed, fault_phase_s=FAULT_PHASE_S))
    report = result.report
    print(f"\nchaos seed {seed}: " + json.dumps(report, indent=1, default=str))
    failed = {rule.name: (rule.violations, rule.examples) for rule in result.verdict.failed}
    assert not failed, f"seed {seed}: rules broken {failed}; logs in {result.workdir}"
