"""Quality benchmark: evolve offline on each real dataset, then score every aggregator on the test split.

For every dataset in ../shared/data with a test split: import (dev = 500 rows, or the whole valid split
when smaller), evolve 5 generations with the offline agents (seed 0), then report test macro-F1 and
accuracy for each aggregator next to two baselines computed on the same splits:
  - WRENCH's expert-written LFs + majority vote (their `weak_labels`; uncovered rows count as wrong),
  - a classifier on sentence embeddings trained on dev only, no pool (the `embedding` aggregator).
Test labels are read only after fitting, to score.

    python bench/quality.py [--datasets youtube sms ...] [--generations 5] [--out bench/results/quality.md]
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.agents.offline import OfflineProposer  # noqa: E402
from engine.domain import AUDIT  # noqa: E402
from engine.evolve import EvolveConfig, evolve  # noqa: E402
from engine.ingest.importer import IngestOptions, import_frame, import_path  # noqa: E402
from engine.labeling import evaluate  # noqa: E402
from engine.sandbox.executor import SandboxExecutor  # noqa: E402
from engine.score import accuracy, macro_f1, majority_vote  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
AGGREGATORS = ("mv", "wmv", "ds", "evoagg", "auto")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    import os

    return f"{os.cpu_count()} cores, {cpu}"


def wrench_lf_baseline(folder: Path) -> dict | None:
    """WRENCH's expert LFs + majority vote on test (ties to the lowest class; uncovered rows wrong)."""
    test = json.loads((folder / "test.json").read_text())
    if not test or "weak_labels" not in next(iter(test.values())):
        return None
    y = np.array([r["label"] for r in test.values()])
    votes = np.array([r["weak_labels"] for r in test.values()])
    k = len(json.loads((folder / "label.json").read_text()))
    pred = majority_vote(votes, k)
    return {"macro_f1": macro_f1(y, pred, k), "accuracy": accuracy(y, pred)}


def import_banking77(store: Store, folder: Path, dev_size: int, seed: int, audit_fraction: float) -> None:
    """banking77 has no valid split: a seeded stratified dev sample comes from train, the rest is pool."""
    names = json.loads((folder / "categories.json").read_text())
    train = pd.read_csv(folder / "train.csv")
    test = pd.read_csv(folder / "test.csv")
    rng = random.Random(seed)
    by_class = train.groupby("category").indices
    per_class = max(1, dev_size // len(by_class))
    dev_idx = sorted(i for idx in by_class.values() for i in rng.sample(list(idx), min(per_class, len(idx))))
    train["split"] = "pool"
    train.loc[dev_idx, "split"] = "dev"
    test["split"] = "test"
    frame = pd.concat([train, test], ignore_index=True)
    frame["id"] = [f"{s}-{i}" for i, s in enumerate(frame["split"])]
    opts = IngestOptions(label_column="category", labels=tuple(names), dev_size=dev_size, seed=seed,
                         audit_fraction=audit_fraction)
    import_frame(store, frame, opts, dataset="banking77", source=str(folder))


def run_dataset(name: str, workdir: Path, generations: int, seed: int, aggregators: tuple[str, ...],
                audit_fraction: float = IngestOptions.audit_fraction,
                reuse: bool = False) -> dict:
    folder = SHARED / name
    if workdir.exists() and not reuse:
        shutil.rmtree(workdir)
    store = Store.open(workdir)
    if not store.has_data():
        if name == "banking77":
            import_banking77(store, folder, 500, seed, audit_fraction)
        else:
            import_path(store, folder, IngestOptions(dev_size=500, seed=seed, audit_fraction=audit_fraction))
    row: dict = {"dataset": name, "dev": store.count_examples("dev"), "audit": store.count_examples(AUDIT),
                 "test": store.count_examples("test")}
    started = time.monotonic()
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, generations, EvolveConfig(seed=seed))
        row["evolve_s"] = round(time.monotonic() - started, 1)
        row["pool"] = len(store.pool_ids())
        for agg in aggregators:
            t = time.monotonic()
            result = evaluate(store, executor, "test", agg, seed)
            row[agg] = result["macro_f1"]
            row[f"{agg}_acc"] = result["accuracy"]
            row[f"{agg}_s"] = round(time.monotonic() - t, 1)
            if agg == "auto":
                row["auto_chose"] = result.get("chosen", "")
            if agg == "mv":
                row["mv_coverage"] = result["coverage"]
        t = time.monotonic()
        result = evaluate(store, executor, "test", "embedding", seed)
        row["emb_dev_only"] = result["macro_f1"]
        row["emb_dev_only_acc"] = result["accuracy"]
    baseline = wrench_lf_baseline(folder) if (folder / "test.json").exists() else None
    row["wrench_lf_mv"] = round(baseline["macro_f1"], 4) if baseline else None
    row["wrench_lf_mv_acc"] = round(baseline["accuracy"], 4) if baseline else None
    return row


def table(rows: list[dict], aggregators: tuple[str, ...]) -> str:
    head = ["dataset", "dev (audit)", "test", "pool", "evolve s", "WRENCH LFs + MV", "embeddings (dev only)"]
    head += [f"pool + {a}" for a in aggregators] + ["auto chose"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r: dict, key: str) -> str:
        if r.get(key) is None:
            return "–"
        return f"{r[key]:.3f} / {r[key + '_acc']:.3f}"

    for r in rows:
        cells = [r["dataset"], f"{r['dev']} ({r.get('audit', 0)})", str(r["test"]), str(r["pool"]), str(r["evolve_s"]),
                 cell(r, "wrench_lf_mv"), cell(r, "emb_dev_only")]
        cells += [cell(r, a) for a in aggregators] + [str(r.get("auto_chose", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=["youtube", "sms", "trec", "semeval", "chemprot",
                                                          "banking77"])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--audit-fraction", type=float, default=IngestOptions.audit_fraction,
                        help="share of dev held back from the agents and the gate (0: none)")
    parser.add_argument("--aggregators", nargs="*", default=list(AGGREGATORS))
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp")
    parser.add_argument("--reuse", action="store_true", help="resume existing workspaces instead of starting fresh")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "quality.md")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    aggregators = tuple(args.aggregators)
    rows = []
    for name in args.datasets:
        workdir = args.workdir / f"{name}-g{args.generations}-s{args.seed}-a{args.audit_fraction}"
        print(f"== {name}", file=sys.stderr, flush=True)
        rows.append(run_dataset(name, workdir, args.generations, args.seed, aggregators, args.audit_fraction,
                                args.reuse))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text = (f"Test macro-F1 / accuracy. Measured {date.today().isoformat()} on {machine()} with "
            f"`python bench/quality.py` ({args.generations} generations, offline agents, seed {args.seed}, "
            f"dev = 500 rows or the whole valid split when smaller, audit share {args.audit_fraction}). "
            "Rows with no label count as wrong.\n\n"
            + table(rows, aggregators) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps(rows, indent=2))
    print(text)


if __name__ == "__main__":
    main()
