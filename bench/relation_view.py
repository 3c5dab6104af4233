"""Which text the relation TF-IDF reads, judged on rows that are neither dev nor test: the withheld gold labels
of pool rows.

The "relation" feature of relation tasks (`auto`'s `relation-only` and `evoagg[relation]` candidates, and the
student's third view) was TF-IDF of the words between the two mentions (word uni- and bigrams). Since 5eb77d6 it
reads `text_views.relation_context`: those words marked by place, with the WINDOW words before and after the pair,
the near words and the mention order (single words). Both are fitted here on the same evolved workspace:

  between           the words between the mentions, word 1-2 grams (the feature before)
  context           `relation_context`, single words (the feature now)
  context_bigrams   `relation_context`, word 1-2 grams

For each: `auto` as it ships, fitted on dev (audit rows as in the product, the student on the unlabeled rows),
scored by macro-F1 on pool rows the student did not learn from, against their WRENCH train labels (read here only).
ChemProt's pool (12,861 rows) leaves ~9,000 rows outside the student's 4,000-row sample; SemEval's (1,749) fits in
one sample, so there the student learns from a seeded half of the pool rows and the other half is scored.
Workspaces are bench/student_validation.py's (imported and evolved as bench/quality.py does).

    python bench/relation_view.py [--datasets chemprot semeval] [--seeds 0 1 2] [--out bench/results/relation_view]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.student_validation import HeldOut, auto_on_held, evolved_inputs, grid_parser, run_and_save  # noqa: E402
from bench.throughput import measured  # noqa: E402
from engine.aggregators.auto import AutoAggregator  # noqa: E402
from engine.aggregators.features import RELATION_NGRAMS, TfidfFeatures  # noqa: E402
from engine.text_views import relation_context, view_text  # noqa: E402

TEXTS = {"between": (lambda example: view_text(example, "between"), (1, 2)),
         "context": (relation_context, RELATION_NGRAMS),
         "context_bigrams": (relation_context, (1, 2))}


def run(name: str, seed: int, generations: int) -> dict:
    frame, votes, feats, labels = evolved_inputs(name, seed, generations)
    rows = HeldOut.of(frame, name, labels, seed)
    examples = [{**fields, "text": text} for fields, text in zip(frame["fields"], frame["text"], strict=True)]
    row = {"dataset": name, "seed": seed, "held_rows": int(len(rows.held)), "student_rows": int(len(rows.sample))}
    for text_name, (text_of, ngrams) in TEXTS.items():
        started = time.monotonic()
        relation = TfidfFeatures(word_ngrams=ngrams).fit_transform([text_of(e) for e in examples])
        got = auto_on_held(AutoAggregator(len(labels), seed=seed), votes, {**feats, "relation": relation}, rows)
        row[text_name], row[f"{text_name}_chose"], row[f"{text_name}_dev"] = got["f1"], got["chose"], got["dev"]
        row[f"{text_name}_s"] = round(time.monotonic() - started, 1)  # the relation TF-IDF's fit included
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# The relation feature's text on held-out pool rows: `bench/relation_view.py`\n",
             measured(meta) + " `auto`'s macro-F1 on pool rows outside the student's "
             "rows, against their withheld WRENCH train labels (never dev, never test); its dev out-of-fold score of "
             "what it chose in brackets.\n",
             "| dataset | seed | held rows | " + " | ".join(f"{name} | auto chose" for name in TEXTS) + " |",
             "|---|---|---|" + "---|---|" * len(TEXTS)]
    for r in rows:
        cells = [f"{r[name]:.3f} ({r[f'{name}_dev']:.3f}) | {r[f'{name}_chose']}" for name in TEXTS]
        lines.append(f"| {r['dataset']} | {r['seed']} | {r['held_rows']} | " + " | ".join(cells) + " |")
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        means = ", ".join(f"{text} {np.mean([r[text] for r in mine]):.3f}" for text in TEXTS)
        lines.append(f"\n{name}: mean {means}; context at least as high as between in "
                     f"{sum(r['context'] >= r['between'] for r in mine)} of {len(mine)} seeds.")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = grid_parser(__doc__, ["chemprot", "semeval"], "relation_view").parse_args()
    run_and_save(args, "relation_view.py", lambda name, seed: run(name, seed, args.generations), markdown)


if __name__ == "__main__":
    main()
