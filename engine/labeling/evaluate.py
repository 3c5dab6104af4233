"""Labels scored on a split (test labels read only here, after fitting), the pool's own majority vote, and the
aggregators compared."""
from __future__ import annotations

import numpy as np

from engine.aggregators.registry import (
    AGGREGATORS,
    aggregator_entry,
)
from engine.domain import ABSTAIN
from engine.events import EventSink, quiet
from engine.labeling.features import aggregators_for
from engine.labeling.fit import THRESHOLD, fit_and_predict, multilabel_scores
from engine.metrics.score import accuracy, macro_f1, majority_vote
from engine.sandbox.executor import Executor
from engine.store.workspace import Store


def evaluate(store: Store, executor: Executor, split: str = "test", aggregator: str = "mv", seed: int = 0,
             on_event: EventSink = quiet, threshold: float = THRESHOLD) -> dict:
    """Quality on a labeled split. Every row counts: a row that gets no label is wrong."""
    if split not in ("test", "dev"):
        raise ValueError("evaluate on 'test' or 'dev'")
    if not store.count_examples(split):  # every labeled row went to dev (no more than the dev size): nothing to score
        raise ValueError(f"the workspace has no {split} rows to score" + (
            ": every labeled row went to dev; import more labeled rows, or score dev (--split dev)"
            if split == "test" else ""))
    splits = ("dev",) if split == "dev" else ("dev", split)
    # dev rows must be out-of-fold only when dev is the split being scored
    result = fit_and_predict(store, executor, aggregator, splits, seed, on_event, score_dev=split == "dev",
                             threshold=threshold)
    task = store.load_task()
    gold = store.gold(split)  # (n,) labels, or (n, k) label sets on a multi-label task
    gold_row = {e: i for i, e in enumerate(store.example_ids(split))}
    rows = np.array([i for i, ex in enumerate(result.soft.example_ids) if ex in gold_row], dtype=int)
    y = gold[[gold_row[result.soft.example_ids[i]] for i in rows]]
    hard = result.hard[rows]
    coverage = round(float((result.n_votes[rows] > 0).mean()), 4)
    if task.multi_label:
        figures = {"multi_label": True, "threshold": threshold, **multilabel_scores(y, hard), "coverage": coverage,
                   "labeled": round(float(hard.any(axis=1).mean()), 4) if len(rows) else 0.0}
    else:
        figures = {"macro_f1": round(macro_f1(y, hard, len(task.labels)), 4), "accuracy": round(accuracy(y, hard), 4),
                   "coverage": coverage, "labeled": round(float((hard != ABSTAIN).mean()), 4)}
    out = {
        "split": split,
        "aggregator": aggregator,
        **figures,
        "n": int(len(rows)),
        "pool_size": len(store.pool_ids()),
        "generation": store.last_complete_generation(),
        **{key: value for key, value in result.dev_scores.to_dict().items()
           if key in ("chosen", "chosen_on", "uses_pool", "estimate", "interval", "judged_on", "n_rows",
                      "thin_classes", "unjudged_classes")},
    }
    if not task.multi_label:
        out["pool_majority_vote"] = pool_majority_vote(store, y, [result.soft.example_ids[i] for i in rows],
                                                       len(task.labels))
        if out.get("uses_pool") is False:
            out["note"] = ("these labels read no votes: the pool did not shape them (the model chosen learned from "
                           "the text alone); pool_majority_vote is the pool's own figure")
    return out


def pool_majority_vote(store: Store, y: np.ndarray, example_ids: list[str], n_classes: int) -> dict | None:
    """The pool's own figure on these rows: its majority vote's macro-F1 (a row nobody votes on is wrong) and the
    share of rows it covers; None for an empty pool."""
    pool = store.pool_ids()
    if not pool:
        return None
    votes = store.vote_matrix(pool, example_ids=example_ids).votes
    return {"macro_f1": round(macro_f1(y, majority_vote(votes, n_classes), n_classes), 4),
            "coverage": round(float((votes != ABSTAIN).any(axis=1).mean()), 4) if len(votes) else 0.0}


# what the studio's comparison fits: all but `auto-pool`, a second full `auto` (students included) whose dev figure,
# without audit rows, is the inflated one; `evopool eval --aggregator auto-pool` and bench/quality.py report it on test
COMPARED = tuple(name for name in AGGREGATORS if name != "auto-pool")


def compare_aggregators(store: Store, executor: Executor, names: tuple[str, ...] = COMPARED, seed: int = 0,
                        on_event: EventSink = quiet) -> list[dict]:
    """Dev out-of-fold scores of each aggregator, side by side (dev only: no test label is read).

    On a multi-label task only those that can label it, and not `auto` or `auto-pool` (they are `evoagg` there).
    """
    task = store.load_task()
    if task.multi_label:
        names = tuple(n for n in names if n in aggregators_for(task) and not aggregator_entry(n).evoagg_on_multi_label)
    out = []
    for name in names:
        result = fit_and_predict(store, executor, name, ("dev",), seed, on_event)
        out.append({"aggregator": name, **result.dev_scores.to_dict()})
    return out
