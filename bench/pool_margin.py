"""Does the pool earn its place? `auto-pool` (the best model that reads the pool's votes) against `auto-text` (the
best without them), and what `auto` chooses, judged on rows that are neither dev nor test: the withheld gold labels
of pool rows.

bench/quality.py reports the same two on test, which must not steer a choice; this bench is where the rules behind
them are chosen. For each dataset and seed: import and evolve afresh as bench/quality.py does (dev 500 rows, audit
share 0.2, 5 generations of the offline agents), then fit on dev, as the product does:
  text        `auto-text`: the best text-only model (students of text-only teachers included)
  pool        `auto-pool`: the best model that reads the votes (students of vote-reading teachers included)
  auto        `auto` as it ships
  auto before  `auto` with `student_mix=False`: no student that reads the votes, no mean of the students
  pool before  `auto-pool` so (engine/aggregators/auto.py; until 902eb46 the "no margin" way, `auto` with
               `selected_min_gain=0`, stood here)
and report macro-F1 on the pool rows the students did not learn from (a seeded half of the pool when it fits one
student sample: student_validation.py's split), with each choice and its dev out-of-fold score.

    python bench/pool_margin.py [--datasets youtube semeval banking77 trec sms chemprot] [--seeds 0 1 2]
                                [--out bench/results/pool_margin]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.student_validation import HeldOut, autos_on_held, evolved_inputs, grid_parser, run_and_save  # noqa: E402
from bench.throughput import measured  # noqa: E402
from engine.aggregators.auto import AutoAggregator  # noqa: E402

WAYS = {"text": dict(text_only=True), "pool": dict(pool_only=True), "auto": {},
        "auto_before": dict(student_mix=False), "pool_before": dict(pool_only=True, student_mix=False)}


def run(name: str, seed: int, generations: int) -> dict:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations, prefix="pool_margin", fresh=True)
    rows = HeldOut.of(frame, name, labels, seed)
    autos = {way: AutoAggregator(len(labels), seed=seed, **options) for way, options in WAYS.items()}
    return {"dataset": name, "seed": seed, "held_rows": int(len(rows.held)), "audit_rows": int(rows.audit.sum()),
            **autos_on_held(autos, votes, feats, rows)}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Does the pool earn its place, on held-out pool rows: `bench/pool_margin.py`\n",
             measured(meta) + " Macro-F1 on the pool rows outside the students' rows, "
             "against their withheld WRENCH train labels (never dev, never test); each choice with its out-of-fold "
             "dev score.\n",
             "| dataset | seed | held rows | audit rows | text | chose (dev) | pool | chose (dev) | pool − text "
             "| auto | chose (dev) | auto before | chose (dev) | pool before | chose (dev) |", "|" + "---|" * 15]
    for r in rows:
        cells = [r["dataset"], r["seed"], r["held_rows"], r["audit_rows"]]
        for way in WAYS:
            cells += [f"{r[way]:.3f}", f"{r[f'{way}_chose']} ({r[f'{way}_dev']:.3f})"]
            if way == "pool":
                cells.append(f"{r['pool'] - r['text']:+.3f}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "| dataset | text | pool | pool − text | auto | auto before | pool before | pool before − text |",
              "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        mean = {way: np.mean([r[way] for r in mine]) for way in WAYS}
        lines.append(f"| {name} | {mean['text']:.3f} | {mean['pool']:.3f} | {mean['pool'] - mean['text']:+.3f} | "
                     f"{mean['auto']:.3f} | {mean['auto_before']:.3f} | {mean['pool_before']:.3f} | "
                     f"{mean['pool_before'] - mean['text']:+.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = grid_parser(__doc__, ["youtube", "semeval", "banking77", "trec", "sms", "chemprot"],
                       "pool_margin").parse_args()
    run_and_save(args, "pool_margin.py", lambda name, seed: run(name, seed, args.generations), markdown)


if __name__ == "__main__":
    main()
