"""auto's estimate, checked on rows that are neither dev nor test: the withheld gold labels of pool rows.

The WRENCH train rows are imported as unlabeled pool rows and no label of theirs is ever read by the product; minus
the seeded sample the student learns from (its teacher's labels there, not the gold ones), they are a third set of
rows on which to check what `auto` and `auto-text` say of themselves (`estimate_`, from dev alone) against what they
score. For each dataset and seed: import and evolve as bench/quality.py does (dev 500 rows, audit share 0.2, 5
generations of the offline agents on the compiled path), fit on dev, and score the held pool rows. Datasets whose
pool leaves fewer than 500 rows outside the student's sample (semeval, youtube) cannot be checked this way.
The helpers here (`evolved_inputs`, `HeldOut`, `auto_on_held`, the grid) serve bench/cross_fit.py,
bench/relation_view.py and bench/vote_weight.py too.

    python bench/student_validation.py [--datasets chemprot trec sms] [--seeds 0 1 2]
                                       [--out bench/results/student_validation]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import imported, save_embedding_cache  # noqa: E402
from bench.throughput import measured, run_meta, save_result  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.agents.offline.selection import SelectConfig  # noqa: E402
from engine.aggregators.auto import AutoAggregator  # noqa: E402
from engine.aggregators.base import take_rows  # noqa: E402
from engine.aggregators.student import student_sample_size, unlabeled_sample  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.apply.votes import ensure_votes  # noqa: E402
from engine.evolve import EvolveConfig, evolve  # noqa: E402
from engine.ingest.readers import read_wrench  # noqa: E402
from engine.labeling.fit import labeling_inputs  # noqa: E402
from engine.metrics.score import macro_f1, pool_macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
TMP = ROOT / "bench" / "results" / "tmp"
MIN_ROWS = 500  # held-out pool rows needed for a figure worth reading


def pool_gold(name: str, ids: np.ndarray, labels: tuple[str, ...]) -> np.ndarray:
    """The withheld gold label of each pool row (read here only, to score)."""
    if name == "banking77":  # import_banking77 names train row i "pool-i" or "dev-i" (train comes first)
        train = pd.read_csv(SHARED / name / "train.csv")
        return np.array([labels.index(train["category"].iloc[int(i.split("-")[1])]) for i in ids])
    wrench, _ = read_wrench(SHARED / name)
    gold_of = dict(zip(wrench["id"], wrench["label"], strict=True))  # label names
    return np.array([labels.index(gold_of[i]) for i in ids])


def evolved_inputs(name: str, seed: int, generations: int, prefix: str = "validation", fresh: bool = False
                   ) -> tuple[pd.DataFrame, np.ndarray, dict, tuple[str, ...]]:
    """The rows, votes, text features and label names of a dataset's workspace, imported and evolved as
    bench/quality.py does (this bench's workspaces, reused when there unless `fresh`; bench/vote_weight.py reads them
    too; another bench names its own with `prefix`)."""
    store = imported(TMP / f"{prefix}-{name}-s{seed}", name, seed, fresh)
    labels = store.load_task().labels
    with CompiledExecutor() as executor:
        if store.last_complete_generation() < generations:
            evolve(store, OfflineProposer(), executor, generations, EvolveConfig(seed=seed))
        frame, _, votes, feats = labeling_inputs(store, executor, None, "auto")
    save_embedding_cache(store, TMP / f"embeddings-{name}.npz")
    Store.close_all()
    return frame, votes, feats, labels


@contextmanager
def fresh_evolved(name: str, seed: int, workdir: Path, select: SelectConfig, generations: int
                  ) -> Iterator[tuple[Store, CompiledExecutor, float]]:
    """A new workspace of `name` at `workdir`, imported as bench/quality.py does, evolved `generations` by the offline
    agents under `select`: (the store, the executor it ran on, the evolve's seconds), the executor open until the end
    of the block."""
    store = imported(workdir, name, seed, fresh=True)
    with CompiledExecutor() as executor:
        started = time.monotonic()
        evolve(store, OfflineProposer(select=select, min_fires=select.min_fires), executor, generations,
               EvolveConfig(seed=seed))
        yield store, executor, time.monotonic() - started


def pool_mv_on_gold(store: Store, executor: CompiledExecutor, name: str) -> tuple[float, int]:
    """The pool's majority-vote macro-F1 on every pool row against its withheld gold label, and how many rows."""
    ids, labels = store.pool_ids(), store.load_task().labels
    ensure_votes(store, executor, ids, "pool")
    pool = store.vote_matrix(ids, "pool")
    gold = pool_gold(name, np.asarray(pool.example_ids), labels)
    return pool_macro_f1(pool.votes, gold, len(labels)), len(gold)


def student_and_held(pool: np.ndarray, seed: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool rows the student of `n_classes` classes may learn from, and the rest (scored): its seeded sample when
    that leaves rows out, else a seeded half."""
    limit = student_sample_size(n_classes)
    if len(pool) > limit:
        sample = pool[unlabeled_sample(len(pool), seed, limit)]
    else:
        sample = np.sort(np.random.default_rng(seed).permutation(pool)[: len(pool) // 2])
    return sample, np.setdiff1d(pool, sample)


@dataclass(frozen=True)
class HeldOut:
    """Rows of an evolved workspace's frame: dev (with its labels and audit marks), the pool rows the student learns
    from, and the pool rows scored against their withheld gold labels (`student_and_held`)."""

    dev: np.ndarray
    y: np.ndarray
    audit: np.ndarray
    sample: np.ndarray
    held: np.ndarray
    gold: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, name: str, labels: tuple[str, ...], seed: int) -> HeldOut:
        split = frame["split"].to_numpy()
        pool, dev = np.flatnonzero(split == "pool"), np.flatnonzero(split == "dev")
        sample, held = student_and_held(pool, seed, len(labels))
        return cls(dev, frame["label"].to_numpy()[dev].astype(int), frame["audit"].to_numpy(dtype=bool)[dev],
                   sample, held, pool_gold(name, frame["id"].to_numpy()[held], labels))


def auto_on_held(auto: AutoAggregator, votes: np.ndarray, feats: dict, rows: HeldOut) -> dict:
    """`auto` fitted on dev as the product fits it (audit rows, the pool chosen on dev, its student on
    `rows.sample`), scored on the held rows: macro-F1, what it chose, that choice's dev out-of-fold score, whether it
    reads the pool's votes, seconds."""
    started = time.monotonic()
    auto.fit(votes[rows.dev], rows.y, take_rows(feats, rows.dev), audit=rows.audit, votes_selected=True,
             unlabeled_votes=votes[rows.sample], unlabeled_X=take_rows(feats, rows.sample))
    predicted = auto.predict_proba(votes[rows.held], take_rows(feats, rows.held)).argmax(axis=1)
    return {"f1": round(macro_f1(rows.gold, predicted, auto.n_classes), 4), "chose": auto.chosen_,
            "dev": round(float(auto.oof_scores_[auto.chosen_]), 4), "uses_pool": bool(auto.uses_votes_),
            "s": round(time.monotonic() - started, 1)}


def autos_on_held(autos: dict[str, AutoAggregator], votes: np.ndarray, feats: dict, rows: HeldOut) -> dict:
    """`auto_on_held` of each named way: `{way: its F1, way_chose, way_dev, way_uses_pool, way_s}`, a bench's row."""
    out: dict = {}
    for way, auto in autos.items():
        got = auto_on_held(auto, votes, feats, rows)
        out[way] = got.pop("f1")
        out.update({f"{way}_{key}": value for key, value in got.items()})
    return out


def run(name: str, seed: int, generations: int) -> dict | None:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations)
    k = len(labels)
    n_pool = int((frame["split"] == "pool").sum())
    # the student's own sample only (no seeded half of a small pool, as `HeldOut` would take): what auto learns from
    held_rows = max(n_pool - student_sample_size(k), 0)
    if held_rows < MIN_ROWS:
        print(f"  {name}: {held_rows} pool rows outside the student's sample, fewer than {MIN_ROWS}: skipped",
              file=sys.stderr)
        return None
    rows = HeldOut.of(frame, name, labels, seed)
    out: dict = {"dataset": name, "seed": seed, "held_rows": int(len(rows.held))}
    for way, auto in (("auto", AutoAggregator(k, seed=seed)), ("auto_text", AutoAggregator(k, seed=seed,
                                                                                          text_only=True))):
        got = auto_on_held(auto, votes, feats, rows)
        est = auto.estimate_
        out |= {way: got["f1"], f"{way}_chose": got["chose"], f"{way}_s": got["s"],
                f"{way}_estimate": None if est is None else est.macro_f1,
                f"{way}_interval": None if est is None else [est.low, est.high]}
    return out


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# auto's estimate against held-out pool rows: `bench/student_validation.py`\n",
             measured(meta) + " Macro-F1 on the pool rows outside the student's sample, against their withheld "
             "WRENCH train labels (never dev, never test), beside the estimate and 90 % interval auto gave from dev.\n",
             "| dataset | seed | held rows | auto chose | held F1 | estimate | interval | auto-text held F1 | "
             "estimate | interval |", "|---|---|---|---|---|---|---|---|---|---|"]

    def cells(r: dict, way: str) -> str:
        interval = r[f"{way}_interval"]
        return (f"{r[way]:.3f} | {r[f'{way}_estimate'] if r[f'{way}_estimate'] is not None else '–'} | "
                + (f"{interval[0]:.3f}–{interval[1]:.3f}" if interval else "–"))
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['held_rows']} | {r['auto_chose']} | {cells(r, 'auto')} | "
                     f"{cells(r, 'auto_text')} |")
    judged = [(r[w], r[f"{w}_estimate"], r[f"{w}_interval"]) for r in rows for w in ("auto", "auto_text")
              if r[f"{w}_estimate"] is not None]
    if judged:
        lines.append(f"\nMean |estimate − held F1| {np.mean([abs(e - f) for f, e, _ in judged]):.3f} over "
                     f"{len(judged)} estimates; the interval held the held-out figure in "
                     f"{sum(lo <= f <= hi for f, _, (lo, hi) in judged)} of {len(judged)}.")
    return "\n".join(lines) + "\n"


def grid_parser(doc: str, datasets: list[str], out: str) -> argparse.ArgumentParser:
    """The options of a bench over datasets x seeds on this bench's evolved workspaces (add your own to it)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=datasets)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / out)
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="write one table from the .json files of earlier runs (e.g. two side by side) "
                             "instead of running")
    return parser


def run_grid(args: argparse.Namespace, script: str, run: Callable[[str, int], dict | list[dict] | None]
             ) -> tuple[dict, list[dict]]:
    """`run(dataset, seed)` for every dataset and seed asked for (a row, several, or None: skipped), each row
    printed as it comes; returns the run's header (`run_meta`) and the rows."""
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    meta = run_meta(script)
    rows: list[dict] = []
    for name in args.datasets:
        for seed in args.seeds:
            print(f"== {name} seed {seed}", file=sys.stderr, flush=True)
            got = run(name, seed)
            for row in [] if got is None else [got] if isinstance(got, dict) else got:
                rows.append(row)
                print(json.dumps(row), flush=True)
    return meta, rows


def run_and_save(args: argparse.Namespace, script: str, run: Callable[[str, int], dict | list[dict] | None],
                 markdown: Callable[[list[dict], dict], str]) -> None:
    """`run_grid`, then the rows and their table written to `args.out` (.json and .md); with `args.merge`, the rows
    of those earlier results instead (the first one's header, its command naming every part)."""
    if getattr(args, "merge", None):
        parts = [json.loads(path.read_text()) for path in args.merge]
        commits = {p["meta"].get("commit") for p in parts}
        if len(commits) > 1:
            sys.exit(f"--merge: the parts ran at different commits {sorted(map(str, commits))}: one table needs one")
        meta = dict(parts[0]["meta"], command=" beside ".join(f"`{p['meta']['command']}`" for p in parts).strip("`"))
        rows = [row for part in parts for row in part["rows"]]
    else:
        meta, rows = run_grid(args, script, run)
    save_result(args.out, {"meta": meta, "rows": rows}, markdown(rows, meta))


def main() -> None:
    args = grid_parser(__doc__, ["chemprot", "trec", "sms"], "student_validation").parse_args()
    run_and_save(args, "student_validation.py", lambda name, seed: run(name, seed, args.generations), markdown)


if __name__ == "__main__":
    main()
