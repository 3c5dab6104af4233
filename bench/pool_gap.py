"""The pool's fitness -> new-rows gap under each selection setting, judged on the withheld gold labels of pool rows.

bench/quality.py reports the gap of the pool's majority vote from the fitness rows (where the gate chose it) to test;
test must not steer the settings that choose the pool, so this bench is where they are chosen. For each dataset,
seed and setting: import and evolve afresh as bench/quality.py does (dev 500 rows, audit share 0.2, 5 generations of
the offline agents), then report the pool's size, its majority-vote macro-F1 on the fitness rows and on every pool row
against its withheld WRENCH train label (never dev, never test), and the gap between the two.

A setting is a set of `SelectConfig` overrides (the proposer's preview of the gate), `name=value` pairs joined by
commas; `default` is the shipped config. Each setting gets its own workspace, so settings compare on the same dev rows.

    python bench/pool_gap.py [--datasets chemprot banking77] [--seeds 0 1 2] \\
                             [--settings default min_gain=0.003] [--out bench/results/pool_gap]
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import save_embedding_cache  # noqa: E402
from bench.student_validation import TMP, fresh_evolved, grid_parser, pool_mv_on_gold, run_and_save  # noqa: E402
from bench.throughput import measured  # noqa: E402
from engine.agents.offline.selection import SelectConfig  # noqa: E402
from engine.evolve import current_dev_macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402


def parse_setting(text: str) -> dict:
    """`default` -> {}; `min_gain=0.003,precision_z=1` -> the SelectConfig overrides, typed as the fields are."""
    if text == "default":
        return {}
    types = {f.name: type(f.default) for f in fields(SelectConfig)}
    out = {}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        if key not in types:
            raise SystemExit(f"unknown SelectConfig field {key!r}; known: {sorted(types)}")
        if types[key] is bool and value.lower() not in ("true", "false"):
            raise SystemExit(f"{key} is true or false, not {value!r}")
        out[key] = value.lower() == "true" if types[key] is bool else types[key](value)
    return out


def run(name: str, seed: int, setting: str, generations: int) -> dict:
    workdir = TMP / f"pool_gap-{name}-s{seed}-{setting.replace('=', '_').replace(',', '+')}"
    select = replace(SelectConfig(), **parse_setting(setting))
    with fresh_evolved(name, seed, workdir, select, generations) as (store, executor, seconds):
        pool = len(store.pool_ids())
        fitness = current_dev_macro_f1(store)
        held, n_rows = pool_mv_on_gold(store, executor, name)
    save_embedding_cache(store, TMP / f"embeddings-{name}.npz")
    Store.close_all()
    shutil.rmtree(workdir, ignore_errors=True)
    return {"dataset": name, "seed": seed, "setting": setting, "pool": pool, "evolve_s": round(seconds, 1),
            "pool_rows": n_rows, "mv_fitness": round(fitness, 4), "mv_pool_rows": round(held, 4),
            "gap": round(fitness - held, 4)}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# The pool's fitness → new-rows gap per selection setting: `bench/pool_gap.py`\n",
             measured(meta) + " The pool's majority-vote macro-F1 on the fitness rows and "
             "on every pool row against its withheld WRENCH train label (never dev, never test); rows no annotator "
             "votes on count as wrong.\n",
             "| dataset | seed | setting | pool | evolve s | MV fitness | MV pool rows | gap |", "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['setting']} | {r['pool']} | {r['evolve_s']} | "
                     f"{r['mv_fitness']:.3f} | {r['mv_pool_rows']:.3f} | {r['gap']:.3f} |")
    lines += ["", "## Mean over seeds", "",
              "| dataset | setting | seeds | pool | MV pool rows | gap | seeds whose gap is smaller / equal / larger "
              "than the first setting's |", "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        settings = list(dict.fromkeys(r["setting"] for r in mine))
        first = {r["seed"]: r["gap"] for r in mine if r["setting"] == settings[0]}
        for setting in settings:
            these = [r for r in mine if r["setting"] == setting]
            paired = [(r["gap"], first[r["seed"]]) for r in these if r["seed"] in first]
            versus = " / ".join(str(sum(test(gap, base) for gap, base in paired)) for test in (
                lambda a, b: a < b - 1e-9, lambda a, b: abs(a - b) <= 1e-9, lambda a, b: a > b + 1e-9))
            mean = {key: np.mean([r[key] for r in these]) for key in ("pool", "mv_pool_rows", "gap")}
            lines.append(f"| {name} | {setting} | {len(these)} | {mean['pool']:.1f} | {mean['mv_pool_rows']:.3f} | "
                         f"{mean['gap']:.3f} | " + ("–" if setting == settings[0] else versus)
                         + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = grid_parser(__doc__, ["chemprot", "banking77", "trec", "youtube", "sms", "semeval"], "pool_gap")
    parser.add_argument("--settings", nargs="+", default=["default"],
                        help="SelectConfig overrides per setting (name=value,...), or `default`")
    args = parser.parse_args()
    run_and_save(args, "pool_gap.py", lambda name, seed: [run(name, seed, s, args.generations) for s in args.settings],
                 markdown)


if __name__ == "__main__":
    main()
