"""From the pool's votes to soft labels: features, fitting on dev, honest dev scores, evaluation.

Aggregators are fitted on dev labels only (Dawid–Skene, which needs no labels, on every row's votes).
Dev rows get out-of-fold predictions, so every dev figure the studio or CLI shows is honest.
Test labels are read only by `evaluate(split="test")`, after fitting.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engine.aggregate import AGGREGATORS, USES_FEATURES, expected_calibration_error, make_aggregator
from engine.aggregators.base import make_folds
from engine.aggregators.features import TfidfFeatures
from engine.evolve import EventSink, _quiet, ensure_votes
from engine.sandbox import Executor
from engine.score import accuracy, macro_f1
from engine.store import Store
from engine.types import ABSTAIN, SoftLabels

VOTE_ONLY = frozenset({"mv", "wmv", "ds"})  # these give no label where nobody voted
UNSUPERVISED = frozenset({"ds"})


@dataclass(frozen=True)
class LabelingResult:
    soft: SoftLabels
    hard: np.ndarray  # (n,) class index, ABSTAIN where the aggregator gives no label
    n_votes: np.ndarray  # (n,) non-abstaining votes per row
    dev_scores: dict = field(default_factory=dict)  # dev out-of-fold macro_f1, accuracy, ece, chosen
    dev_oof_probs: np.ndarray | None = None  # (n_dev, k)


def text_features(store: Store, texts: list[str], kinds: tuple[str, ...],
                  on_event: EventSink = _quiet) -> dict[str, object]:
    """Named feature matrices for `texts`: sentence embeddings (cached in the workspace) and TF-IDF."""
    out: dict[str, object] = {}
    if "embedding" in kinds:
        from engine.embed import embed_texts, get_embedder

        def progress(done: int, total: int) -> None:
            on_event("embedding", {"done": done, "total": total})

        out["embedding"] = embed_texts(store, texts, get_embedder(store.get_meta("embedder", "minilm")), progress)
    if "tfidf" in kinds:
        out["tfidf"] = TfidfFeatures().fit_transform(texts)
    return out


def _rows(features: dict[str, object], idx: np.ndarray) -> dict[str, object]:
    return {name: matrix[idx] for name, matrix in features.items()}


def _hard(name: str, probs: np.ndarray, n_votes: np.ndarray) -> np.ndarray:
    hard = probs.argmax(axis=1)
    if name in VOTE_ONLY:
        hard = np.where(n_votes > 0, hard, ABSTAIN)
    return hard


def _fit(model, name: str, votes: np.ndarray, y: np.ndarray, features: dict | None, audit: np.ndarray):
    """Fit on labeled dev rows; only `auto` reads the audit mask (it chooses its ingredient there)."""
    extra = {"audit": audit} if name == "auto" else {}
    return model.fit(votes, None if name in UNSUPERVISED else y, features, **extra)


def dev_oof(name: str, n_classes: int, votes: np.ndarray, y: np.ndarray, features: dict | None,
            seed: int = 0, n_splits: int = 5, audit: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold dev probabilities: each fold is predicted by a model that never saw its labels."""
    audit = np.zeros(len(y), dtype=bool) if audit is None else np.asarray(audit, dtype=bool)
    probs = np.zeros((len(y), n_classes))
    for train, held in make_folds(y, n_splits=n_splits, seed=seed):
        model = make_aggregator(name, n_classes, seed)
        _fit(model, name, votes[train], y[train], _rows(features, train) if features else None, audit[train])
        probs[held] = model.predict_proba(votes[held], _rows(features, held) if features else None)
    return probs


def _prepare(store: Store, executor: Executor, splits: tuple[str, ...] | None, aggregator: str,
             on_event: EventSink):
    pool = store.pool_ids()
    if not pool and aggregator in VOTE_ONLY:
        raise ValueError("the pool is empty: run a generation (or approve an annotator) first")
    for split in splits or ("dev", "test", "pool"):
        if store.count_examples(split):
            ensure_votes(store, executor, pool, split, on_event)
    if splits is None:
        frame = store.examples_frame()
    else:
        frame = pd.concat([store.examples_frame(s) for s in splits], ignore_index=True)
    ids = list(frame["id"])
    votes = store.vote_matrix(pool, example_ids=ids).votes
    kinds = ("embedding", "tfidf") if aggregator == "auto" else ("embedding",) if aggregator in USES_FEATURES else ()
    features = text_features(store, list(frame["text"]), kinds, on_event) if kinds else None
    return frame, ids, votes, features


def fit_and_predict(store: Store, executor: Executor, aggregator: str, splits: tuple[str, ...] | None = None,
                    seed: int = 0, on_event: EventSink = _quiet, score_dev: bool = True) -> LabelingResult:
    """Fit `aggregator` on dev and label the rows of `splits` (None: every row).

    With `score_dev` the dev rows get out-of-fold predictions and dev scores (five more fits); without
    it (scoring another split) they keep the in-sample fit and `dev_scores` is empty.
    """
    if aggregator not in AGGREGATORS:
        raise ValueError(f"unknown aggregator {aggregator!r}; choose one of {', '.join(AGGREGATORS)}")
    n_classes = len(store.load_task().labels)
    frame, ids, votes, features = _prepare(store, executor, splits, aggregator, on_event)
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    y_dev = frame["label"].to_numpy()[dev].astype(int)
    audit = frame["audit"].to_numpy(dtype=bool)[dev]
    on_event("aggregating", {"aggregator": aggregator, "rows": len(ids)})
    model = make_aggregator(aggregator, n_classes, seed)
    if aggregator in UNSUPERVISED:
        model.fit(votes, None, features)
    else:
        _fit(model, aggregator, votes[dev], y_dev, _rows(features, dev) if features else None, audit)
    probs = model.predict_proba(votes, features)
    n_votes = (votes != ABSTAIN).sum(axis=1)
    oof, dev_scores = None, {}
    if score_dev:
        oof = dev_oof(aggregator, n_classes, votes[dev], y_dev, _rows(features, dev) if features else None, seed,
                      audit=audit)
        probs[dev] = oof
    hard = _hard(aggregator, probs, n_votes)
    if score_dev:
        dev_scores = {
            "macro_f1": round(macro_f1(y_dev, hard[dev], n_classes), 4),
            "accuracy": round(accuracy(y_dev, hard[dev]), 4),
            "ece": round(expected_calibration_error(y_dev, oof), 4),
            "n": int(len(dev)),
        }
        if audit.any():  # the honest figure: rows the agents and the gate never saw
            dev_scores["audit_macro_f1"] = round(macro_f1(y_dev[audit], hard[dev][audit], n_classes), 4)
            dev_scores["n_audit"] = int(audit.sum())
    if hasattr(model, "chosen_"):
        dev_scores["chosen"] = model.chosen_
    return LabelingResult(SoftLabels(probs, tuple(ids), aggregator), hard, n_votes, dev_scores, oof)


def soft_labels(store: Store, executor: Executor, aggregator: str = "auto", seed: int = 0,
                on_event: EventSink = _quiet) -> LabelingResult:
    """Soft labels for every row of the workspace (what `export` writes)."""
    return fit_and_predict(store, executor, aggregator, None, seed, on_event)


def evaluate(store: Store, executor: Executor, split: str = "test", aggregator: str = "mv", seed: int = 0,
             on_event: EventSink = _quiet) -> dict:
    """Quality on a labeled split. Every row counts: a row that gets no label is wrong."""
    if split not in ("test", "dev"):
        raise ValueError("evaluate on 'test' or 'dev'")
    splits = ("dev",) if split == "dev" else ("dev", split)
    # dev rows must be out-of-fold only when dev is the split being scored
    result = fit_and_predict(store, executor, aggregator, splits, seed, on_event, score_dev=split == "dev")
    gold_by_id = dict(zip(store.example_ids(split), store.labels(split), strict=False))
    rows = np.array([i for i, ex in enumerate(result.soft.example_ids) if ex in gold_by_id], dtype=int)
    y = np.array([gold_by_id[result.soft.example_ids[i]] for i in rows])
    hard = result.hard[rows]
    n_classes = len(store.load_task().labels)
    return {
        "split": split,
        "aggregator": aggregator,
        "macro_f1": round(macro_f1(y, hard, n_classes), 4),
        "accuracy": round(accuracy(y, hard), 4),
        "coverage": round(float((result.n_votes[rows] > 0).mean()), 4),
        "labeled": round(float((hard != ABSTAIN).mean()), 4),
        "n": int(len(rows)),
        "pool_size": len(store.pool_ids()),
        "generation": store.last_complete_generation(),
        **({"chosen": result.dev_scores["chosen"]} if "chosen" in result.dev_scores else {}),
    }


def compare_aggregators(store: Store, executor: Executor, names: tuple[str, ...] = AGGREGATORS, seed: int = 0,
                        on_event: EventSink = _quiet) -> list[dict]:
    """Dev out-of-fold scores of each aggregator, side by side (dev only: no test label is read)."""
    out = []
    for name in names:
        result = fit_and_predict(store, executor, name, ("dev",), seed, on_event)
        out.append({"aggregator": name, **result.dev_scores})
    return out
