"""Quality benchmark: evolve offline on each real dataset, then score every aggregator on the test split.

For every dataset in ../shared/data with a test split and every seed: import (dev = 500 rows, or the whole
valid split when smaller), evolve 5 generations with the offline agents, then report test macro-F1 and
accuracy for each aggregator next to baselines computed on the same splits:
  - WRENCH's expert-written LFs + majority vote (their `weak_labels`; uncovered rows count as wrong),
  - a classifier on sentence embeddings trained on dev only, no pool (the `embedding` aggregator),
  - "best without the pool": `auto-text`, the best text-only model (students of text-only teachers
    included) chosen on dev the way `auto` chooses,
  - "best with the pool": `auto-pool`, the best model that reads the pool's votes (students of vote-reading
    teachers included), chosen the same way: issue 12's margin is this minus that, two choices made alike.
and the pool's majority-vote macro-F1 on the fitness rows (where the gate chose it), the audit rows and test,
whose gap says how far the pool's dev figures are from the truth. A summary table gives mean +- sd over seeds.
Test labels are read only after fitting, to score.

Sentence embeddings are cached per dataset in `<workdir>/embeddings-<dataset>.npz` (texts are the same for
every seed), so only the first run of a dataset pays for embedding.

    python bench/quality.py [--datasets youtube sms ...] [--seeds 0 1 2] [--out bench/results/quality.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, commit, machine  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.agents.offline.selection import SelectConfig  # noqa: E402
from engine.aggregators.registry import aggregator_entry  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.domain import AUDIT  # noqa: E402
from engine.embed.base import text_hash  # noqa: E402
from engine.embed.registry import get_embedder  # noqa: E402
from engine.evolve import EvolveConfig, current_dev_macro_f1, evolve  # noqa: E402
from engine.gate import GateConfig  # noqa: E402
from engine.ingest.importer import IngestOptions, import_frame, import_path  # noqa: E402
from engine.labeling.evaluate import evaluate  # noqa: E402
from engine.metrics.score import accuracy, macro_f1, majority_vote, pool_macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402
from engine.text_views import masked_views, task_views  # noqa: E402

AGGREGATORS = ("mv", "wmv", "ds", "evoagg", "auto-text", "auto-pool", "auto")
NAMED = {"auto-text": "best without the pool", "auto-pool": "best with the pool"}  # columns named by what they say
EMBEDDER = get_embedder().name  # what the workspaces cache embeddings under


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


def import_dataset(store: Store, name: str, seed: int, audit_fraction: float = IngestOptions.audit_fraction) -> None:
    """One dataset of ../shared/data into a fresh workspace as every quality bench imports it: dev 500 rows (or the
    whole valid split when smaller), seeded."""
    if name == "banking77":
        import_banking77(store, SHARED / name, 500, seed, audit_fraction)
    else:
        import_path(store, SHARED / name, IngestOptions(dev_size=500, seed=seed, audit_fraction=audit_fraction))


def _for_embedder(path: Path) -> Path:
    """The cache file of the embedder in use: vectors of another (`$EVOPOOL_EMBEDDER`) must not be read as its."""
    return path.with_name(f"{path.stem}.{EMBEDDER.replace('@', '-')}{path.suffix}")


def load_embedding_cache(store: Store, path: Path) -> None:
    """Put the dataset's cached sentence embeddings into a fresh workspace (texts are seed-independent)."""
    path = _for_embedder(path)
    if not path.exists():
        return
    data = np.load(path)
    store.save_embeddings(EMBEDDER, [str(h) for h in data["hashes"]], data["vectors"])


def save_embedding_cache(store: Store, path: Path) -> None:
    """Keep every embedding the workspace now holds for the next seed or run of this dataset."""
    path = _for_embedder(path)
    frame = store.examples_frame()
    texts = set(frame["text"])
    if "between" in task_views(store.load_task().fields):  # and the masked views auto embeds (`masked_views`)
        texts |= {piece for f, t in zip(frame["fields"], frame["text"], strict=True)
                  for piece in masked_views({**f, "text": t})}
    hashes = sorted({text_hash(t) for t in texts})
    found = store.cached_embeddings(EMBEDDER, hashes)
    if found:
        keys = sorted(found)
        # whole or not at all: benches run side by side read and write the same dataset's cache
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
        np.savez(partial, hashes=np.array(keys), vectors=np.stack([found[h] for h in keys]))
        os.replace(partial, path)


def imported(workdir: Path, name: str, seed: int, fresh: bool = False,
             audit_fraction: float = IngestOptions.audit_fraction) -> Store:
    """The workspace at `workdir` holding `name` imported as every quality bench imports it, with the dataset's
    embeddings cached beside it (`<workdir's parent>/embeddings-<name>.npz`): imported now if new or `fresh`, else
    as it stands, evolved or not."""
    if fresh:
        shutil.rmtree(workdir, ignore_errors=True)
    store = Store.open(workdir)
    if not store.has_data():
        import_dataset(store, name, seed, audit_fraction)
        load_embedding_cache(store, embedding_cache(workdir, name))
    return store


def embedding_cache(workdir: Path, name: str) -> Path:
    """Where a dataset's sentence embeddings are cached for every workspace beside `workdir`."""
    return workdir.parent / f"embeddings-{name}.npz"


def pool_mv(store: Store, executor: CompiledExecutor) -> dict:
    """The pool's majority-vote macro-F1 on fitness (where it was chosen), audit and test rows."""
    from engine.apply.votes import ensure_votes

    k = len(store.load_task().labels)
    ids = store.pool_ids()
    out = {"pool_mv_fitness": round(current_dev_macro_f1(store), 4)}
    for split in (AUDIT, "test"):
        if not store.count_examples(split):
            out[f"pool_mv_{split}"] = None
            continue
        ensure_votes(store, executor, ids, "dev" if split == AUDIT else split)
        votes = store.vote_matrix(ids, split).votes
        out[f"pool_mv_{split}"] = round(pool_macro_f1(votes, store.gold(split), k), 4)
    return out


def run_dataset(name: str, workdir: Path, generations: int, seed: int, aggregators: tuple[str, ...],
                audit_fraction: float = IngestOptions.audit_fraction,
                reuse: bool = False, raw_estimates: bool = False, select: dict | None = None,
                gate: dict | None = None, compiled: bool = True) -> dict:
    folder = SHARED / name
    store = imported(workdir, name, seed, fresh=not reuse, audit_fraction=audit_fraction)
    cache = embedding_cache(workdir, name)
    row: dict = {"dataset": name, "seed": seed, "dev": store.count_examples("dev"),
                 "audit": store.count_examples(AUDIT), "test": store.count_examples("test")}
    started = time.monotonic()
    with CompiledExecutor(compiled=compiled) as executor:
        if raw_estimates:  # the ablation: raw precision, no cross-fitted gain (the selection before issue 12)
            proposer = OfflineProposer(select=SelectConfig(cross_fit=False, precision_z=0.0, unmined_z=0.0))
            config = EvolveConfig(gate=GateConfig(precision_z=0.0), seed=seed)
        else:
            chosen = replace(SelectConfig(), **(select or {}))  # the proposer passes min_fires on itself
            proposer = OfflineProposer(select=chosen, min_fires=chosen.min_fires)
            config = EvolveConfig(gate=GateConfig.from_dict(gate), seed=seed)
        evolve(store, proposer, executor, generations, config)
        row["evolve_s"] = round(time.monotonic() - started, 1)
        row["pool"] = len(store.pool_ids())
        row.update(pool_mv(store, executor))
        for agg in aggregators:
            t = time.monotonic()
            result = evaluate(store, executor, "test", agg, seed)
            row[agg] = result["macro_f1"]
            row[f"{agg}_acc"] = result["accuracy"]
            row[f"{agg}_s"] = round(time.monotonic() - t, 1)
            if aggregator_entry(agg).chooses:
                row[f"{agg}_chose"] = result.get("chosen", "")
                row[f"{agg}_uses_pool"] = result.get("uses_pool")
            # the figure the studio shows beside the truth: chosen and measured on dev rows, no test label read
            row[f"{agg}_estimate"] = result.get("estimate")
            row[f"{agg}_interval"] = result.get("interval")
            row[f"{agg}_judged_on"] = result.get("judged_on")
            if agg == "mv":
                row["mv_coverage"] = result["coverage"]
        t = time.monotonic()
        result = evaluate(store, executor, "test", "embedding", seed)
        row["emb_dev_only"] = result["macro_f1"]
        row["emb_dev_only_acc"] = result["accuracy"]
    save_embedding_cache(store, cache)
    baseline = wrench_lf_baseline(folder) if (folder / "test.json").exists() else None
    row["wrench_lf_mv"] = round(baseline["macro_f1"], 4) if baseline else None
    row["wrench_lf_mv_acc"] = round(baseline["accuracy"], 4) if baseline else None
    return row


def table(rows: list[dict], aggregators: tuple[str, ...]) -> str:
    head = ["dataset", "seed", "dev (audit)", "test", "pool", "evolve s", "pool MV fitness / audit / test",
            "WRENCH LFs + MV", "embeddings (dev only)"]
    head += [NAMED.get(a, f"pool + {a}") for a in aggregators]
    head += ["auto chose", "auto uses pool", "best with the pool chose"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r: dict, key: str) -> str:
        if r.get(key) is None:
            return "–"
        return f"{r[key]:.3f} / {r[key + '_acc']:.3f}"

    def mv(r: dict) -> str:
        return " / ".join("–" if r.get(f"pool_mv_{s}") is None else f"{r[f'pool_mv_{s}']:.3f}"
                          for s in ("fitness", "audit", "test"))

    for r in rows:
        cells = [r["dataset"], str(r.get("seed", 0)), f"{r['dev']} ({r.get('audit', 0)})", str(r["test"]),
                 str(r["pool"]), str(r["evolve_s"]), mv(r), cell(r, "wrench_lf_mv"), cell(r, "emb_dev_only")]
        cells += [cell(r, a) for a in aggregators] + [str(r.get("auto_chose", "")), str(r.get("auto_uses_pool")),
                                                      str(r.get("auto-pool_chose", "–"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.3f}"


def summary(rows: list[dict], targets: dict[str, float]) -> str:
    """Mean ± sd over seeds per dataset, with the issue's targets beside the figures they concern."""
    head = ["dataset", "seeds", "evolve s (max)", "pool MV fitness", "pool MV audit", "pool MV test",
            "gap fitness → test", "pool + evoagg", "best without the pool", "best with the pool",
            "with − without (≥ 0.01)", "pool + auto", "auto target", "auto − best without", "auto uses pool"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        gaps = [r["pool_mv_test"] - r["pool_mv_fitness"] for r in mine]
        lead = [r["auto"] - r["auto-text"] for r in mine if "auto" in r and "auto-text" in r]
        margin = [r["auto-pool"] - r["auto-text"] for r in mine if "auto-pool" in r and "auto-text" in r]
        cells = [name, ",".join(str(r["seed"]) for r in mine), f"{max(r['evolve_s'] for r in mine):.1f}",
                 _ms([r["pool_mv_fitness"] for r in mine]), _ms([r["pool_mv_audit"] for r in mine]),
                 _ms([r["pool_mv_test"] for r in mine]), _ms(gaps), _ms([r.get("evoagg") for r in mine]),
                 _ms([r.get("auto-text") for r in mine]), _ms([r.get("auto-pool") for r in mine]), _ms(margin),
                 _ms([r.get("auto") for r in mine]),
                 f"≥ {targets[name]:.2f}" if name in targets else "–", _ms(lead),
                 f"{sum(bool(r.get('auto_uses_pool')) for r in mine)} of {len(mine)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def estimate_summary(rows: list[dict], aggregator: str = "auto") -> str:
    """Issue 43's table: per dataset, `aggregator`'s test macro-F1 (mean, sd over seeds), how far the estimate shown
    to the expert fell from it, how often its 90 % interval held it, and the interval's median width."""
    head = ["dataset", "seeds", "dev rows", "test macro-F1 mean", "sd over seeds", "mean |estimate − test|",
            "within ±0.05", "interval held", "median width", "auto s (max)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    totals = {"runs": 0, "close": 0, "held": 0}
    widths_500: list[float] = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name and r.get(f"{aggregator}_estimate") is not None]
        if not mine:
            continue
        test = np.array([r[aggregator] for r in mine])
        est = np.array([r[f"{aggregator}_estimate"] for r in mine])
        low = np.array([r[f"{aggregator}_interval"][0] for r in mine])
        high = np.array([r[f"{aggregator}_interval"][1] for r in mine])
        close, held = int((abs(est - test) <= 0.05).sum()), int(((low <= test) & (test <= high)).sum())
        totals["runs"] += len(mine)
        totals["close"] += close
        totals["held"] += held
        if all(r["dev"] >= 500 for r in mine):
            widths_500 += list(high - low)
        lines.append("| " + " | ".join([
            name, ",".join(str(r["seed"]) for r in mine), str(mine[0]["dev"]), f"{test.mean():.3f}",
            f"{test.std(ddof=1) if len(test) > 1 else 0.0:.3f}", f"{np.abs(est - test).mean():.3f}",
            f"{close} of {len(mine)}", f"{held} of {len(mine)}", f"{np.median(high - low):.3f}",
            f"{max(r.get(f'{aggregator}_s', 0) for r in mine):.1f}"]) + " |")
    lines.append(f"\nAll runs: the estimate within ±0.05 of test in {totals['close']} of {totals['runs']}; the 90 % "
                 f"interval held the test figure in {totals['held']} of {totals['runs']}; median width where dev has "
                 f"500 rows {np.median(widths_500) if widths_500 else float('nan'):.3f}.")
    return "\n".join(lines)


TARGETS = {"chemprot": 0.56, "trec": 0.87, "semeval": 0.66, "banking77": 0.83, "sms": 0.97, "youtube": 0.95}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=["youtube", "sms", "trec", "semeval", "chemprot",
                                                          "banking77"])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--audit-fraction", type=float, default=IngestOptions.audit_fraction,
                        help="share of dev held back from the agents and the gate (0: none)")
    parser.add_argument("--aggregators", nargs="*", default=list(AGGREGATORS))
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp")
    parser.add_argument("--reuse", action="store_true", help="resume existing workspaces instead of starting fresh")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "quality.md")
    parser.add_argument("--raw-estimates", action="store_true",
                        help="ablation: raw precision and no cross-fitted gain in the offline selection and the gate")
    parser.add_argument("--select", type=json.loads, default=None,
                        help='ablation: JSON overriding the offline selection (SelectConfig)')
    parser.add_argument("--gate", type=json.loads, default=None,
                        help="ablation: JSON overriding the gate's thresholds (GateConfig)")
    parser.add_argument("--sandbox-only", action="store_true",
                        help="run template annotators in the sandbox too (the figures must not change)")
    parser.add_argument("--merge", type=Path, nargs="*", default=None,
                        help="write one table from the .json files of earlier runs (e.g. one run per seed, side "
                             "by side) instead of running")
    args = parser.parse_args()
    if args.merge:
        rows = [row for path in args.merge for row in json.loads(path.read_text())]
        args.seeds = sorted({row["seed"] for row in rows})
        order = {name: i for i, name in enumerate(args.datasets)}
        rows.sort(key=lambda row: (order.get(row["dataset"], len(order)), row["seed"]))
        write(args, rows, tuple(args.aggregators))
        return
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    aggregators = tuple(args.aggregators)
    at_commit = commit()  # at the start: commits land while a long run goes on
    rows: list[dict] = []
    for name in args.datasets:
        for seed in args.seeds:
            workdir = args.workdir / (f"{name}-g{args.generations}-s{seed}-a{args.audit_fraction}"
                                      + ("-raw" if args.raw_estimates else ""))
            print(f"== {name} seed {seed}", file=sys.stderr, flush=True)
            rows.append(run_dataset(name, workdir, args.generations, seed, aggregators, args.audit_fraction,
                                    args.reuse, args.raw_estimates, args.select, args.gate,
                                    not args.sandbox_only) | {"commit": at_commit})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            write(args, rows, aggregators)  # after every run: a stopped benchmark keeps what it measured


def ablation_flags(args: argparse.Namespace) -> str:
    return "".join(f" --{name} '{json.dumps(value)}'" for name, value in (("select", args.select), ("gate", args.gate))
                   if value)


def measured_at(rows: list[dict]) -> str:
    """The commit(s) the rows were measured at (a merge of parts run apart names each), or "unknown" for rows
    written before they recorded it."""
    return ", ".join(sorted({row.get("commit", "unknown") for row in rows})) or "unknown"


def write(args: argparse.Namespace, rows: list[dict], aggregators: tuple[str, ...]) -> None:
    text = (f"Measured {date.today().isoformat()} at commit {measured_at(rows)} on {machine()} "
            f"(`nproc` {os.cpu_count()}, `uname -m` {platform.machine()}) with `python bench/quality.py --seeds "
            f"{' '.join(map(str, args.seeds))}{' --raw-estimates' if args.raw_estimates else ''}"
            f"{ablation_flags(args)}` "
            f"({args.generations} generations, offline agents, dev = 500 rows "
            f"or the whole valid split when smaller, audit share {args.audit_fraction}). Test macro-F1; "
            "rows with no label count as wrong. `evolve s`: wall time of the generations on a shared machine.\n\n"
            "## The estimate shown beside the test figure\n\n" + estimate_summary(rows) + "\n\n"
            "## Mean ± sd over seeds\n\n" + summary(rows, TARGETS) + "\n\n"
            "## Every run (test macro-F1 / accuracy)\n\n" + table(rows, aggregators) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps(rows, indent=2))
    print(text)


if __name__ == "__main__":
    main()
