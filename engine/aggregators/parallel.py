"""Worker processes for auto's independent fits (candidates' out-of-fold fits, students' folds).

The fits are small single-threaded LBFGS problems, so processes (joblib's loky), not threads; results come back
in the order the calls were listed, so a choice never depends on how many ran at once.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

# below this many dev rows x classes the fits take less than starting worker processes (about 2 s): SMS's 500
# rows x 2 classes ran 4.0 s here and 5.6 s on two workers; ChemProt's 500 x 10, 27 s here and 20 s on two
PARALLEL_MIN_CELLS = 2500


def worker_count(n_jobs: int | None, calls: int, cells: int) -> int:
    """Worker processes for `calls` independent fits (1: run here). The fits are single-threaded (small LBFGS
    problems), so processes, not threads; below PARALLEL_MIN_CELLS dev rows x classes, or with one call, here."""
    jobs = min(os.cpu_count() or 1, 4) if n_jobs is None else n_jobs
    if jobs <= 1 or calls < 2 or cells < PARALLEL_MIN_CELLS:
        return 1
    return min(jobs, calls)


_warming: list[threading.Thread] = []  # a start of the worker processes still under way (see prewarm_workers)
_warming_lock = threading.Lock()  # labeling may run on several threads (the studio's jobs)


def _imported() -> bool:
    import engine.aggregators.evoagg  # noqa: F401  (what a worker's fits run: the LRs and the student)
    import engine.aggregators.student  # noqa: F401

    return True


def prewarm_workers(n_rows: int, n_classes: int, n_jobs: int | None = None) -> None:
    """Start auto's worker processes now, on a thread, if its fits will run on them: spawning them and importing
    numpy, scikit-learn and the engine there takes about a second, which the caller's feature work then hides."""
    workers = worker_count(n_jobs, 1 << 30, n_rows * n_classes)  # as many as a batch of fits will ask for
    if workers == 1:
        return
    from joblib import Parallel, delayed

    with _warming_lock:
        _warming[:] = [t for t in _warming if t.is_alive()]  # a finished start left by a serial fit is no user
        if _warming:
            return
        thread = threading.Thread(target=lambda: Parallel(n_jobs=workers, backend="loky")(
            delayed(_imported)() for _ in range(workers)), daemon=True)
        thread.start()
        _warming.append(thread)


def _wait_for_warming() -> None:
    with _warming_lock:
        threads = list(_warming)
        _warming.clear()
    for thread in threads:  # one user of the workers at a time
        thread.join()


def run_calls(calls: list[tuple[Callable, tuple]], n_jobs: int | None, cells: int,
              costs: Sequence[float] | None = None) -> list:
    """`f(*args)` for each call, results in the calls' order, on up to `n_jobs` worker processes (None: the
    cores, at most 4). With `costs` (estimates), the costliest are handed out first, so no worker is left with
    a long fit at the end while the others wait."""
    workers = worker_count(n_jobs, len(calls), cells)
    if workers == 1:
        return [f(*args) for f, args in calls]
    _wait_for_warming()
    from joblib import Parallel, delayed

    order = list(range(len(calls))) if costs is None else sorted(range(len(calls)), key=lambda i: -costs[i])
    done = Parallel(n_jobs=workers, backend="loky")(delayed(calls[i][0])(*calls[i][1]) for i in order)
    out: list = [None] * len(calls)
    for i, result in zip(order, done, strict=True):
        out[i] = result
    return out
