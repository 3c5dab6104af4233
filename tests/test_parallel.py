"""auto's worker processes: results come back in the order the calls were listed, whatever order they ran in."""
from __future__ import annotations

import os

from engine.aggregators.parallel import PARALLEL_MIN_CELLS, prewarm_workers, run_calls, worker_count


def _pid_and(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def test_results_keep_the_listing_order_when_the_costliest_run_first():
    calls = [(_pid_and, (x,)) for x in range(6)]
    prewarm_workers(PARALLEL_MIN_CELLS, 1, n_jobs=2)  # started early, joined before the workers are used
    out = run_calls(calls, 2, PARALLEL_MIN_CELLS, costs=[1, 9, 3, 7, 5, 2])
    assert [square for _, square in out] == [x * x for x in range(6)]
    assert all(pid != os.getpid() for pid, _ in out)  # they ran on worker processes


def test_small_problems_run_here():
    assert worker_count(2, 6, PARALLEL_MIN_CELLS - 1) == 1 and worker_count(1, 6, PARALLEL_MIN_CELLS) == 1
    out = run_calls([(_pid_and, (3,))], 2, PARALLEL_MIN_CELLS)
    assert out == [(os.getpid(), 9)]
