"""Does the best text-only model earn a place among the student's teachers? Judged on rows that are neither dev
nor test: the withheld gold labels of pool rows.

Without audit rows (youtube, semeval and banking77, whose dev is too small to spare a fifth) and with the pool chosen
on dev, `auto` leaves out at prediction whatever reads the votes, but vote readers still teach its students: the
best candidate and the best vote reader, both ranked on dev figures the selection inflated. Since 9f9d016 the best
text-only candidate (or an average of the top ones, if that scores higher) teaches too (`text_teacher=True`); such an
average also joins what auto may choose, so the switch measures both. With audit rows nothing changes, so the
datasets that have them are left out by default.

For each dataset and seed: `auto` both ways, fitted on dev as in the product, scored by macro-F1 on the pool rows the
student did not learn from (a seeded half of the pool when it fits one student sample; student_validation.py's
split). Workspaces are bench/student_validation.py's (imported and evolved as bench/quality.py does).

    python bench/text_teacher.py [--datasets semeval youtube banking77] [--seeds 0 1 2]
                                 [--out bench/results/text_teacher]
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

WAYS = {"before": False, "text_teacher": True}


def run(name: str, seed: int, generations: int) -> dict:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations)
    rows = HeldOut.of(frame, name, labels, seed)
    autos = {way: AutoAggregator(len(labels), seed=seed, text_teacher=on) for way, on in WAYS.items()}
    return {"dataset": name, "seed": seed, "held_rows": int(len(rows.held)), "student_rows": int(len(rows.sample)),
            **autos_on_held(autos, votes, feats, rows)}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# The best text-only model as a teacher too: `bench/text_teacher.py`\n",
             measured(meta) + " `auto` macro-F1 on the pool rows outside the student's "
             "rows, against their withheld WRENCH train labels (never dev, never test); its choice and the choice's "
             "out-of-fold dev score.\n",
             "| dataset | seed | held rows | before | chose (dev) | text teacher | chose (dev) | change |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['held_rows']} | {r['before']:.3f} | {r['before_chose']} "
                     f"({r['before_dev']:.3f}) | {r['text_teacher']:.3f} | {r['text_teacher_chose']} "
                     f"({r['text_teacher_dev']:.3f}) | {r['text_teacher'] - r['before']:+.3f} |")
    changed = [r for r in rows if r["before_chose"] != r["text_teacher_chose"]]
    if rows:
        lines.append(f"\nThe choice changed in {len(changed)} of {len(rows)} runs; mean change over all runs "
                     f"{np.mean([r['text_teacher'] - r['before'] for r in rows]):+.4f}"
                     + (f", over the changed ones {np.mean([r['text_teacher'] - r['before'] for r in changed]):+.4f}"
                        if changed else "") + ".")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = grid_parser(__doc__, ["semeval", "youtube", "banking77"], "text_teacher").parse_args()
    run_and_save(args, "text_teacher.py", lambda name, seed: run(name, seed, args.generations), markdown)


if __name__ == "__main__":
    main()
