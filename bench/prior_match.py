"""Prior matching, checked on rows that are neither dev nor test: the withheld gold labels of the pool rows.

`auto` weighs each student twice: as trained, and with its class shares on the unlabeled rows pulled toward
dev's (`student<...>+prior`, engine/aggregators/student.py `prior_bias`), taking the shifted one only on a
strictly higher out-of-fold dev score that also beats the same student unshifted by `PRIOR_MIN_GAIN`. Dev alone
cannot say whether that choice is right, and test must not be looked at, so this bench scores `auto` with and
without the shifted students on the WRENCH train rows the product imports as unlabeled pool rows: the labels it
delivers for them, against their withheld gold labels (never read by the product). The offsets are fitted on the
student's predictions for unlabeled rows outside its sample, with no label. `dev gain`: per student weighed, its
shifted version's out-of-fold dev macro-F1 minus its own (what the minimum gain is compared with).

For each dataset and seed: import and evolve as bench/quality.py does (the workspaces of
bench/student_validation.py), fit `auto` on dev with `prior_matching` off and on, and report macro-F1 on every
pool row and what each chose.

    python bench/prior_match.py [--datasets ...] [--seeds 0 1 2] [--out bench/results/prior_match]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.student_validation import SHARED, evolved_inputs, pool_gold  # noqa: E402
from bench.throughput import measured, run_meta, save_result  # noqa: E402
from engine.aggregators.auto import AutoAggregator  # noqa: E402
from engine.aggregators.base import take_rows  # noqa: E402
from engine.aggregators.choice_names import PRIOR_SUFFIX  # noqa: E402
from engine.aggregators.student import auto_unlabeled_sample  # noqa: E402
from engine.score import macro_f1  # noqa: E402

SMALL_DEV_ROWS = 3  # a class with this few dev rows is reported on its own: how often each model names it
DATASETS = ["youtube", "sms", "trec", "semeval", "chemprot", "banking77"]


def run(name: str, seed: int, generations: int) -> dict:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations)
    k = len(labels)
    pool = np.flatnonzero((frame["split"] == "pool").to_numpy())
    gold = pool_gold(name, frame["id"].to_numpy()[pool], labels)
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    y = frame["label"].to_numpy()[dev].astype(int)
    sample = pool[auto_unlabeled_sample(len(pool), seed, k)]  # as the product hands them to auto
    fit = dict(audit=frame["audit"].to_numpy(dtype=bool)[dev], votes_selected=True,
               unlabeled_votes=votes[sample], unlabeled_X=take_rows(feats, sample))
    X_dev, X_pool = take_rows(feats, dev), take_rows(feats, pool)
    row = {"dataset": name, "seed": seed, "pool_rows": int(len(pool))}
    small = [c for c in range(k) if np.sum(y == c) <= SMALL_DEV_ROWS]  # classes dev can hardly teach
    named = {}
    for key, matching in (("off", False), ("on", True)):
        model = AutoAggregator(k, seed=seed, prior_matching=matching).fit(votes[dev], y, X_dev, **fit)
        row[f"{key}_chose"] = model.chosen_
        if matching:
            scores = model.oof_scores_
            row["dev_gains"] = {n: round(scores[n + PRIOR_SUFFIX] - scores[n], 4) for n in scores
                                if n + PRIOR_SUFFIX in scores}
        named[key] = model.predict_proba(votes[pool], X_pool).argmax(axis=1)
        row[f"{key}_f1"] = round(macro_f1(gold, named[key], k), 4)
        if not matching:  # the shift applied to the unshifted choice whatever dev says (a student's only)
            kept = model.members_[0]
            forced = (kept.predict_proba(votes[pool], X_pool, match_prior=True).argmax(axis=1)
                      if model.chosen_.startswith("student<") else named[key])
            row["forced_f1"] = round(macro_f1(gold, forced, k), 4)
    row["small_classes"] = [{"label": labels[c], "dev_rows": int(np.sum(y == c)), "pool_rows": int(np.sum(gold == c)),
                             "named_off": int(np.sum(named["off"] == c)), "named_on": int(np.sum(named["on"] == c))}
                            for c in small]
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Prior matching on the pool rows' withheld gold labels: `bench/prior_match.py`\n",
             measured(meta) + " Macro-F1 of `auto`'s labels for every pool row against "
             "their withheld WRENCH train labels (never dev, never test).\n",
             "`shift forced`: the unshifted choice with the shift applied whatever dev says (when it is a student).\n",
             "| dataset | seed | pool rows | without: chose | F1 | with: chose | F1 | shift forced F1 | dev gain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gains = "; ".join(f"{n}: {g:+.3f}" for n, g in r.get("dev_gains", {}).items()) or "–"
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['pool_rows']} | {r['off_chose']} | {r['off_f1']:.3f} | "
                     f"{r['on_chose']} | {r['on_f1']:.3f} | {r['forced_f1']:.3f} | {gains} |")
    lines += [f"\nClasses with at most {SMALL_DEV_ROWS} dev rows: how many pool rows each model names them on.\n",
              "| dataset | seed | class | dev rows | pool rows holding it | named without | named with |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dataset']} | {r['seed']} | {c['label']} | {c['dev_rows']} | {c['pool_rows']} | "
              f"{c['named_off']} | {c['named_on']} |" for r in rows for c in r["small_classes"]]
    lines.append("\n| dataset | mean without | mean with | mean shift forced | runs that chose a shifted student |\n"
                 "|---|---|---|---|---|")
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        off, on, forced = (np.mean([r[key] for r in mine]) for key in ("off_f1", "on_f1", "forced_f1"))
        shifted = sum(r["on_chose"].endswith(PRIOR_SUFFIX) for r in mine)
        lines.append(f"| {name} | {off:.3f} | {on:.3f} | {forced:.3f} | {shifted} of {len(mine)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prior_match")
    parser.add_argument("--merge", nargs="+", type=Path, help="join the JSON files of runs side by side instead")
    args = parser.parse_args()
    if args.merge:  # runs made side by side, joined into one table
        parts = [json.loads(p.read_text()) for p in args.merge]
        rows = sorted((r for p in parts for r in p["rows"]),
                      key=lambda r: (DATASETS.index(r["dataset"]) if r["dataset"] in DATASETS else 99, r["seed"]))
        save_result(args.out, {"meta": parts[0]["meta"], "rows": rows}, markdown(rows, parts[0]["meta"]))
        return
    if not SHARED.is_dir():
        sys.exit(f"no real data at {SHARED}: this benchmark needs ../shared/data")
    meta, rows = run_meta("prior_match.py"), []
    for name in args.datasets:
        for seed in args.seeds:
            print(f"== {name} seed {seed}", file=sys.stderr, flush=True)
            rows.append(run(name, seed, args.generations))
            print(json.dumps(rows[-1]), flush=True)
            save_result(args.out, {"meta": meta, "rows": rows}, markdown(rows, meta))  # a stopped run keeps these

if __name__ == "__main__":
    main()
