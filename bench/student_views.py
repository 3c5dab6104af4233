"""Which text views a relation task's student should read, asked of rows that are neither dev nor test.

On relation tasks `auto`'s students read the masked sentence embeddings and the TF-IDF of the words between the
two entities, and also weigh a second set with the whole text's TF-IDF (`student_view_sets`), picked per
workspace by dev out-of-fold macro-F1. This bench asks the unlabeled pool rows, whose gold labels the product
never reads, which set is better, and whether dev picks it:

  held-out     the student of auto's teacher (auto without students) fitted on one half of the pool rows
               (at most 4,000 of them) and scored on the other half, then the halves swapped; the mean
  dev pick     the view set whose student of that teacher scored higher out of fold on dev in `auto` itself

For each dataset and seed: the workspace of bench/vote_weight.py (import and 5 generations as bench/quality.py).

    python bench/student_views.py [--datasets chemprot semeval] [--seeds 0 1 2]
                                  [--out bench/results/student_views]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import machine  # noqa: E402
from bench.throughput import commit  # noqa: E402
from bench.vote_weight import SHARED, evolved_inputs, pool_gold  # noqa: E402
from engine.aggregators.auto import STUDENT_C, AutoAggregator, student_view_sets  # noqa: E402
from engine.aggregators.base import take_rows  # noqa: E402
from engine.aggregators.student import MAX_UNLABELED, StudentAggregator, unlabeled_sample  # noqa: E402
from engine.score import macro_f1  # noqa: E402


def run(name: str, seed: int, generations: int) -> dict:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations)
    k = len(labels)
    pool = np.flatnonzero((frame["split"] == "pool").to_numpy())
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    y = frame["label"].to_numpy()[dev].astype(int)
    on_dev = dict(audit=frame["audit"].to_numpy(dtype=bool)[dev], votes_selected=True)
    X_dev = take_rows(feats, dev)
    gold = pool_gold(name, frame["id"].to_numpy()[pool], labels)
    teacher = AutoAggregator(k, seed=seed, students=False).fit(votes[dev], y, X_dev, **on_dev)
    order = np.random.default_rng(seed).permutation(len(pool))
    halves = (order[:len(pool) // 2], order[len(pool) // 2:])
    row = {"dataset": name, "seed": seed, "teacher": teacher.chosen_, "pool_rows": int(len(pool))}
    view_sets = student_view_sets(feats)
    for views in view_sets:
        scores = []
        for learn, held in (halves, halves[::-1]):
            learn = np.sort(learn)[:MAX_UNLABELED]
            student = StudentAggregator(k, lambda: None, teacher.chosen_, views, C=STUDENT_C, seed=seed)
            student.fit_from_teacher(teacher, votes[dev], y, X_dev, votes[pool[learn]], take_rows(feats, pool[learn]))
            pred = student.predict_proba(votes[pool[held]], take_rows(feats, pool[held])).argmax(axis=1)
            scores.append(macro_f1(gold[held], pred, k))
        row["+".join(views)] = round(float(np.mean(scores)), 4)
    sample = pool[unlabeled_sample(len(pool), seed)]
    auto = AutoAggregator(k, seed=seed).fit(votes[dev], y, X_dev, **on_dev, unlabeled_votes=votes[sample],
                                            unlabeled_X=take_rows(feats, sample))
    dev_scores = {"+".join(v): auto.oof_scores_.get(f"student<{teacher.chosen_}>[{'+'.join(v)}]") for v in view_sets}
    row["dev_oof"] = {v: None if f is None else round(f, 4) for v, f in dev_scores.items()}
    known = {v: f for v, f in dev_scores.items() if f is not None}
    row["dev_pick"] = max(known, key=known.__getitem__) if known else None
    row["auto_chose"] = auto.chosen_
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    sets = [key for key in rows[0] if "+" in key] if rows else []
    lines = ["# Which views a relation task's student reads: `bench/student_views.py`\n",
             f"Measured {meta['when']} at commit {meta['commit']} on {meta['machine']}, load average {meta['load']} "
             f"at the start. Command: `{meta['command']}`. Held-out: macro-F1 of the student of auto's teacher, "
             "fitted on one half of the pool rows and scored on the other against their withheld gold labels "
             "(never dev, never test), both ways, mean. Dev pick: the set whose student scored higher out of fold "
             "on dev inside `auto`.\n",
             "| dataset | seed | teacher | " + " | ".join(f"held-out {s}" for s in sets) + " | dev pick | auto chose |",
             "|---|---|---|" + "---|" * len(sets) + "---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['teacher']} | "
                     + " | ".join(f"{r[s]:.3f}" for s in sets) + f" | {r['dev_pick']} | {r['auto_chose']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["chemprot", "semeval"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "student_views")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    meta = {"when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(), "machine": machine(),
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "command": "python bench/student_views.py " + " ".join(sys.argv[1:])}
    rows = [run(name, seed, args.generations) for name in args.datasets for seed in args.seeds]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows, meta))


if __name__ == "__main__":
    main()
