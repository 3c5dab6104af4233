"""What audit rows cost and buy: test macro-F1 with and without them, over several seeds.

Audit rows take a share of dev away from the agents and the gate (a pool chosen on fewer rows) and give
`auto` rows the pool was not chosen on (an honest choice of aggregator). For each dataset, seed and audit
share this runs bench/quality.py's pipeline (import, 5 offline generations, test scores) and reports the
mean and spread over seeds, so one lucky seed does not decide the default.

    python bench/audit_ablation.py [--datasets sms trec chemprot] [--seeds 0 1 2] [--fractions 0 0.2]
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, machine  # noqa: E402
from bench.quality import run_dataset  # noqa: E402

AGGREGATORS = ("mv", "evoagg", "auto")


def summary(rows: list[dict], datasets: list[str], fractions: list[float]) -> str:
    lines = ["| dataset | audit share | audit rows | " + " | ".join(f"pool + {a}" for a in AGGREGATORS)
             + " | auto chose |", "|---|---|---|" + "---|" * (len(AGGREGATORS) + 1)]
    for name in datasets:
        for fraction in fractions:
            runs = [r for r in rows if r["dataset"] == name and r["audit_fraction"] == fraction]
            if not runs:
                continue
            cells = [f"{np.mean([r[a] for r in runs]):.3f} ± {np.std([r[a] for r in runs]):.3f}"
                     for a in AGGREGATORS]
            chose = ", ".join(r.get("auto_chose", "") for r in runs)
            lines.append(f"| {name} | {fraction} | {runs[0].get('audit', 0)} | " + " | ".join(cells)
                         + f" | {chose} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=["sms", "trec", "chemprot"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--fractions", nargs="*", type=float, default=[0.0, 0.2])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "audit_ablation.md")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    rows = []
    for name in args.datasets:
        for fraction in args.fractions:
            for seed in args.seeds:
                workdir = args.workdir / f"ablation-{name}-s{seed}-a{fraction}"
                row = run_dataset(name, workdir, args.generations, seed, AGGREGATORS, fraction)
                row.update(seed=seed, audit_fraction=fraction)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    text = (f"Test macro-F1, mean ± standard deviation over seeds {args.seeds}. Measured {date.today().isoformat()} "
            f"on {machine()} with `python bench/audit_ablation.py` ({args.generations} generations, offline "
            "agents, dev = 500 rows or the whole valid split when smaller; the seed draws the audit rows and "
            "drives the agents).\n\n" + summary(rows, args.datasets, args.fractions) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    print(text)


if __name__ == "__main__":
    main()
