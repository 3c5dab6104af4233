"""EvoAgg's vote weight, chosen on rows that are neither dev nor test: the withheld gold labels of pool rows.

EvoAgg is an LR over [text ; one-hot votes] fitted on dev, the rows the pool was chosen on. There the votes are
right more often than on new rows, so the LR learns to trust them too much. Scaling the vote block down by a
weight w makes the L2 penalty on the votes' coefficients 1/w² heavier: the votes must earn their trust. Which
w is a question dev cannot answer (it is the biased set), and test must not be looked at, so this bench asks
the unlabeled pool rows, whose WRENCH train labels (banking77: its train.csv labels) the product never reads.
EvoAgg is fitted on dev alone, so every pool row is held out.

For each dataset and seed: import and evolve as bench/quality.py does (dev 500 rows, audit share 0.2, 5
generations of the offline agents on the compiled path), then for every text feature fit `<feature>-only` and
EvoAgg at each weight on dev, and report macro-F1 on all pool rows. Beside them, how many annotators are right more
often than `<feature>-only` on the pool rows they vote on: a vote can only add to the text where it knows better
(`--fresh` evolves the pools anew instead of reading the workspaces bench/student_validation.py left).

    python bench/vote_weight.py [--datasets chemprot trec sms semeval youtube banking77] [--seeds 0 1 2]
                                [--weights 1 0.5 0.25 0.1] [--out bench/results/vote_weight]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.student_validation import evolved_inputs, grid_parser, pool_gold, run_and_save  # noqa: E402
from bench.throughput import measured  # noqa: E402
from engine.aggregators.base import take_rows  # noqa: E402
from engine.aggregators.evoagg import EvoAgg, TextOnly  # noqa: E402
from engine.metrics.score import macro_f1  # noqa: E402


def beats_text(votes: np.ndarray, gold: np.ndarray, text_pred: np.ndarray) -> tuple[int, int]:
    """(annotators right more often than the text model on the rows they vote on, annotators that vote at all)."""
    better = voting = 0
    for column in votes.T:
        fired = column >= 0
        if fired.any():
            voting += 1
            better += int(np.mean(column[fired] == gold[fired]) > np.mean(text_pred[fired] == gold[fired]))
    return better, voting


def run(name: str, seed: int, generations: int, weights: list[float], fresh: bool = False) -> list[dict]:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations, fresh=fresh)
    k = len(labels)
    pool = np.flatnonzero((frame["split"] == "pool").to_numpy())
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    gold = pool_gold(name, frame["id"].to_numpy()[pool], labels)
    y = frame["label"].to_numpy()[dev].astype(int)
    X_dev, X_pool = take_rows(feats, dev), take_rows(feats, pool)
    out = []
    for feature in feats:
        row = {"dataset": name, "seed": seed, "feature": feature, "pool_rows": int(len(pool))}
        text = TextOnly(k, feature=feature, seed=seed).fit(votes[dev], y, X_dev)
        text_pred = text.predict_proba(votes[pool], X_pool).argmax(axis=1)
        row["text_only"] = round(macro_f1(gold, text_pred, k), 4)
        row["beats_text"], row["voting"] = beats_text(votes[pool], gold, text_pred)
        for w in weights:
            model = EvoAgg(k, feature=feature, seed=seed, vote_weight=w).fit(votes[dev], y, X_dev)
            row[f"w={w:g}"] = round(macro_f1(gold, model.predict_proba(votes[pool], X_pool).argmax(axis=1), k), 4)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def markdown(rows: list[dict], weights: list[float], meta: dict) -> str:
    cols = [f"w={w:g}" for w in weights]
    lines = ["# EvoAgg's vote weight on held-out pool rows: `bench/vote_weight.py`\n",
             measured(meta) + " Macro-F1 on every unlabeled pool row against its withheld "
             "gold label (never dev, never test); EvoAgg and `<feature>-only` fitted on dev alone.\n",
             "## Mean over seeds, per dataset and feature\n",
             "| dataset | feature | seeds | text only | " + " | ".join(f"EvoAgg {c}" for c in cols)
             + " | annotators right more often than the text where they vote |",
             "|---|---|---|---|" + "---|" * (len(cols) + 1)]
    for (name, feature), part in pd.DataFrame(rows).groupby(["dataset", "feature"], sort=False):
        beats = (f"{part['beats_text'].sum()} of {part['voting'].sum()}" if "beats_text" in part
                 and part["beats_text"].notna().all() else "–")  # results recorded before the column: none
        lines.append(f"| {name} | {feature} | {len(part)} | {part['text_only'].mean():.3f} | "
                     + " | ".join(f"{part[c].mean():.3f}" for c in cols) + f" | {beats} |")
    frame = pd.DataFrame(rows)
    lines += ["\n## Over every dataset, seed and feature\n",
              "| | text only | " + " | ".join(f"EvoAgg {c}" for c in cols) + " |",
              "|---|---|" + "---|" * len(cols),
              f"| mean macro-F1 ({len(frame)} fits) | {frame['text_only'].mean():.3f} | "
              + " | ".join(f"{frame[c].mean():.3f}" for c in cols) + " |",
              "| runs where this weight is the best EvoAgg | – | "
              + " | ".join(str(int((frame[c] == frame[cols].max(axis=1)).sum())) for c in cols) + " |",
              "| runs above text only | – | "
              + " | ".join(str(int((frame[c] > frame["text_only"]).sum())) for c in cols) + " |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = grid_parser(__doc__, ["chemprot", "trec", "sms", "semeval", "youtube", "banking77"], "vote_weight")
    parser.add_argument("--weights", nargs="+", type=float, default=[1.0, 0.5, 0.25, 0.1])
    parser.add_argument("--fresh", action="store_true", help="evolve the pools anew (the engine may have changed)")
    args = parser.parse_args()
    run_and_save(args, "vote_weight.py",
                 lambda name, seed: run(name, seed, args.generations, args.weights, args.fresh),
                 lambda rows, meta: markdown(rows, args.weights, meta))


if __name__ == "__main__":
    main()
