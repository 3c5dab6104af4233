"""Where the offline agents mine, judged on rows that are neither dev nor test: the withheld gold labels of pool rows.

The offline agents rank thousands of cues on dev, so a cue's dev precision is partly luck and the pool they build
looks better on the rows it was chosen on (fitness) than anywhere else. Two changes mine elsewhere:
  all_dev   before f3a4567: the generator mines all of dev, the improver dev's failing rows
  halves    since f3a4567: the generator mines each half of dev and reads each cue's precision bound on the other half
            (`SelectConfig.mine_halves`; the preview's gain was already checked on both halves); since 017b180 the
            refiner's added cues too, so `all_dev` also mines those on all of dev
  guessed   on top of halves, the improver mines the unlabeled pool sample against a dev-fitted classifier's guesses
            and dev judges each cue on rows none of which chose it (`SelectConfig.improve_on_pool`)
This bench evolves the same pool two ways (`--ways`, first -> second; 5 generations of the offline agents, dev 500
rows, audit share 0.2, as bench/quality.py) and reports the pool's majority-vote macro-F1 on the fitness rows, on the
audit rows and on every pool row against its WRENCH train label (read here only, to score), and the gap between the
first and the last. With `--auto`, also `auto` (as it ships) on the pool rows the student did not learn from
(`student_validation.student_and_held`).

    python bench/cross_fit.py [--datasets chemprot trec semeval sms youtube banking77] [--seeds 0 1 2] [--auto]
                              [--ways halves guessed] [--out bench/results/cross_fit]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.student_validation import (  # noqa: E402
    TMP,
    HeldOut,
    auto_on_held,
    fresh_evolved,
    grid_parser,
    pool_mv_on_gold,
    run_and_save,
)
from bench.throughput import measured  # noqa: E402
from engine.agents.offline.selection import SelectConfig  # noqa: E402
from engine.aggregators.auto import AutoAggregator  # noqa: E402
from engine.domain import AUDIT  # noqa: E402
from engine.evolve import current_dev_macro_f1  # noqa: E402
from engine.labeling.fit import labeling_inputs  # noqa: E402
from engine.metrics.score import pool_macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

WAYS = {"all_dev": SelectConfig(mine_halves=False, improve_on_pool=False),
        "halves": SelectConfig(improve_on_pool=False), "guessed": SelectConfig()}


def run_way(name: str, seed: int, generations: int, way: str, with_auto: bool) -> dict:
    out: dict = {}
    with fresh_evolved(name, seed, TMP / f"cross_fit-{name}-s{seed}-{way}", WAYS[way], generations) as (
            store, executor, seconds):
        labels = store.load_task().labels
        out["evolve_s"] = round(seconds, 1)
        out["pool"] = len(store.pool_ids())
        out["mv_fitness"] = round(current_dev_macro_f1(store), 4)
        if store.count_examples(AUDIT):
            out["mv_audit"] = round(pool_macro_f1(store.vote_matrix(store.pool_ids(), AUDIT).votes,
                                                  store.gold(AUDIT), len(labels)), 4)
        out["mv_pool_gold"] = round(pool_mv_on_gold(store, executor, name)[0], 4)
        out["gap"] = round(out["mv_fitness"] - out["mv_pool_gold"], 4)
        if with_auto:
            frame, _, votes, feats = labeling_inputs(store, executor, None, "auto")
            rows = HeldOut.of(frame, name, labels, seed)
            out["auto_held"] = auto_on_held(AutoAggregator(len(labels), seed=seed), votes, feats, rows)["f1"]
    Store.close_all()
    return out


def run(name: str, seed: int, generations: int, with_auto: bool, ways: tuple[str, str]) -> dict:
    row: dict = {"dataset": name, "seed": seed, "ways": list(ways)}
    for way in ways:
        for key, value in run_way(name, seed, generations, way, with_auto).items():
            row[f"{way}_{key}"] = value
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    first, second = rows[0].get("ways", ("all_dev", "halves")) if rows else ("all_dev", "halves")
    if any(tuple(r.get("ways", ("all_dev", "halves"))) != (first, second) for r in rows):
        raise ValueError("rows compare different ways: one table compares one pair")
    with_auto = bool(rows) and f"{second}_auto_held" in rows[0]
    cols = ["mv_fitness", "mv_audit", "mv_pool_gold", "gap"] + (["auto_held"] if with_auto else [])
    lines = ["# Where the offline agents mine: `bench/cross_fit.py`\n",
             measured(meta) + f" Pool majority vote macro-F1 on fitness rows, audit rows "
             "and every pool row's withheld WRENCH train label (never test); gap = fitness - pool gold. Each cell: "
             f"{first} -> {second} (see the bench's docstring).\n",
             "| dataset | seed | pool size | " + " | ".join(cols) + " | evolve s |",
             "|---|---|---|" + "---|" * len(cols) + "---|"]

    def cell(r: dict, col: str) -> str:
        a, b = r.get(f"{first}_{col}"), r.get(f"{second}_{col}")
        return "–" if a is None else f"{a:.3f} -> {b:.3f}"

    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r[first + '_pool']} -> {r[second + '_pool']} | "
                     + " | ".join(cell(r, c) for c in cols)
                     + f" | {r[first + '_evolve_s']} -> {r[second + '_evolve_s']} |")
    lines.append("\n| dataset | " + " | ".join(f"mean {c}" for c in cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        means = []
        for c in cols:
            pairs = [(r[f"{first}_{c}"], r[f"{second}_{c}"]) for r in mine if r.get(f"{first}_{c}") is not None]
            means.append("–" if not pairs else
                         f"{np.mean([a for a, _ in pairs]):.3f} -> {np.mean([b for _, b in pairs]):.3f}")
        lines.append(f"| {name} | " + " | ".join(means) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = grid_parser(__doc__, ["chemprot", "trec", "semeval", "sms", "youtube", "banking77"], "cross_fit")
    parser.add_argument("--auto", action="store_true", help="also score auto on the held pool rows (slower)")
    parser.add_argument("--ways", nargs=2, choices=list(WAYS), default=["halves", "guessed"],
                        help="the two ways compared, first -> second")
    args = parser.parse_args()
    run_and_save(args, "cross_fit.py", lambda name, seed: run(name, seed, args.generations, args.auto,
                                                              tuple(args.ways)), markdown)


if __name__ == "__main__":
    main()
