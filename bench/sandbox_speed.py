"""Sandbox throughput: 40 keyword/regex annotators over the bundled demo's comments, votes per second.

Measures the whole executor path (spawn, load chunks, run every annotator, collect votes) with a fresh pool,
so the cost of the worker's confinement and of the fresh fork per annotator run shows.

    python bench/sandbox_speed.py [--rows 6000] [--workers 2] [--repeat 3] [--batch-size 4096]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.domain import Candidate  # noqa: E402
from engine.sandbox.annotators import make_annotator  # noqa: E402
from engine.sandbox.executor import SandboxExecutor  # noqa: E402

WORDS = ["check", "subscribe", "channel", "free", "http", "love", "song", "video", "please", "money",
         "views", "like", "www", "best", "music", "win", "click", "follow", "great", "awesome"]


def annotators() -> list:
    out = []
    for i, word in enumerate(WORDS):
        out.append(make_annotator(Candidate(source=(
            f"def annotate(example):\n    return 'spam' if {word!r} in example['text'].lower() else None\n"),
            agent="bench"), generation=i))
        out.append(make_annotator(Candidate(source=(
            f"import re\nPAT = re.compile(r'\\b{word}\\w*', re.I)\n\n"
            "def annotate(example):\n    return 'ham' if PAT.search(example['text']) is None else 'spam'\n"),
            agent="bench"), generation=i))
    return out


def texts(rows: int) -> list[dict]:
    import pandas as pd
    frames = [pd.read_csv(p) for p in sorted((ROOT / "data").rglob("*.csv"))]
    column = next(c for c in frames[0].columns if c.lower() in ("text", "content", "comment"))
    base = [str(t) for f in frames if column in f.columns for t in f[column].dropna()]
    return [{"text": f"{base[i % len(base)]} #{i}"} for i in range(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=None, help="rows per chunk (default: the executor's)")
    args = parser.parse_args()
    examples, pool = texts(args.rows), annotators()
    best = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        sizing = {"batch_size": args.batch_size} if args.batch_size else {}
        with SandboxExecutor(workers=args.workers, **sizing) as ex:
            results = ex.run(pool, examples, ["ham", "spam"])
        best = min(best, time.perf_counter() - started)
        assert all(r.faults == 0 for r in results), [r.first_error for r in results if r.faults][:3]
    votes = len(pool) * len(examples)
    batch = args.batch_size or "default"
    print(f"{len(pool)} annotators x {len(examples)} rows, {args.workers} workers, batch {batch}: best {best:.2f}s, "
          f"{votes / best:,.0f} votes/s")


if __name__ == "__main__":
    main()
