"""Compiled path vs sandbox: votes/s of the pool the offline agents evolve on a real dataset (default ChemProt).

Evolves a pool (offline agents, --generations, dev = 500 rows) in a scratch workspace, or reads the sources
saved by an earlier run (--pool FILE), then applies it to --rows rows of the dataset's train split (repeated as
needed) with `CompiledExecutor` (templates compiled, the rest in the sandbox) and with the sandbox alone, and
checks the vote matrices are identical.

    python bench/compiled_speed.py [--dataset chemprot] [--rows 20000] [--repeat 3] [--pool pool.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.apply.compiled import compiles  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.domain import Annotator  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def evolve_pool(dataset: str, generations: int, seed: int = 0) -> tuple[list[Annotator], list[str]]:
    """The offline agents' pool on `dataset` (a scratch workspace) and the task's labels."""
    from engine.agents.offline.proposer import OfflineProposer
    from engine.evolve import EvolveConfig, evolve
    from engine.ingest.importer import IngestOptions, import_path
    from engine.store.workspace import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "ws")
        import_path(store, SHARED / dataset, IngestOptions(dev_size=500, seed=seed))
        with CompiledExecutor() as executor:
            evolve(store, OfflineProposer(), executor, generations, EvolveConfig(seed=seed))
        pool = store.annotators(store.pool_ids())
        labels = list(store.load_task().labels)
        Store.close_all()
    return pool, labels


def load_pool(path: Path) -> tuple[list[Annotator], list[str]]:
    saved = json.loads(path.read_text())
    return [Annotator(**a) for a in saved["annotators"]], saved["labels"]


def save_pool(path: Path, pool: list[Annotator], labels: list[str]) -> None:
    keep = ("id", "name", "source", "agent", "generation")
    path.write_text(json.dumps({"labels": labels, "annotators": [{k: getattr(a, k) for k in keep} for a in pool]},
                               indent=1))


def wrench_rows(dataset: str, rows: int) -> list[dict]:
    """The train split's inputs (text, and entities and spans for relation sets), repeated up to `rows`."""
    records = json.loads((SHARED / dataset / "train.json").read_text())
    base = [r["data"] for r in records.values()]
    return [dict(base[i % len(base)]) for i in range(rows)]


def checksum(results: list) -> str:
    matrix = np.stack([r.votes for r in results], axis=1).astype(np.int64)
    return hashlib.sha256(matrix.tobytes()).hexdigest()[:16]


def timed(executor: CompiledExecutor, pool: list[Annotator], rows: list[dict], labels: list[str],
          repeat: int) -> tuple[float, list]:
    best, results = float("inf"), []
    for _ in range(repeat):
        started = time.perf_counter()
        results = executor.run(pool, rows, labels)
        best = min(best, time.perf_counter() - started)
    return best, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="chemprot")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=Path, help="read the pool from this file (written there when absent)")
    args = parser.parse_args()
    if args.pool and args.pool.exists():
        pool, labels = load_pool(args.pool)
    else:
        started = time.perf_counter()
        pool, labels = evolve_pool(args.dataset, args.generations)
        print(f"evolved {len(pool)} annotators in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        if args.pool:
            save_pool(args.pool, pool, labels)
    rows = wrench_rows(args.dataset, args.rows)
    n_compiled = sum(compiles(a.source) for a in pool)
    votes = len(pool) * len(rows)
    with CompiledExecutor(workers=args.workers) as fast, CompiledExecutor(workers=args.workers, compiled=False) as slow:
        fast_s, fast_results = timed(fast, pool, rows, labels, args.repeat)
        slow_s, slow_results = timed(slow, pool, rows, labels, args.repeat)
    same = checksum(fast_results) == checksum(slow_results) and all(
        a.faults == b.faults for a, b in zip(fast_results, slow_results, strict=True))
    print(json.dumps({"dataset": args.dataset, "rows": len(rows), "annotators": len(pool), "compiled": n_compiled,
                      "compiled_s": round(fast_s, 3), "compiled_votes_per_s": round(votes / fast_s),
                      "sandbox_s": round(slow_s, 3), "sandbox_votes_per_s": round(votes / slow_s),
                      "speedup": round(slow_s / fast_s, 1), "identical": same,
                      "checksum": checksum(fast_results)}))
    if not same:
        sys.exit("the compiled and sandbox vote matrices differ")


if __name__ == "__main__":
    main()
