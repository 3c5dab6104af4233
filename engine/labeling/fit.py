"""Fitting an aggregator on dev and labeling every row: out-of-fold dev figures, the estimate, multi-label tasks."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from engine.aggregators.base import make_folds, oof_proba, take_rows
from engine.aggregators.learning_curve import learning_curve_gain
from engine.aggregators.parallel import prewarm_workers
from engine.aggregators.registry import (
    MultiLabelEvoAgg,
    aggregator_entry,
    expected_calibration_error,
    make_aggregator,
    predict_labels,
)
from engine.aggregators.student import auto_unlabeled_sample
from engine.apply.votes import ensure_votes
from engine.domain import ABSTAIN, AUDIT, AutoChoice, DevScores, Estimate, SoftLabels
from engine.events import EventKind, EventSink, quiet
from engine.labeling.features import feature_kinds, text_features
from engine.metrics.estimate import estimate_macro_f1
from engine.metrics.score import accuracy, exact_match, macro_f1, multilabel_f1
from engine.sandbox.executor import Executor
from engine.store.workspace import Store

THRESHOLD = 0.5  # multi-label: a class is predicted where its probability reaches this
# rows predicted at once: every aggregator reads each row alone, so chunks give the same numbers, and at 100K rows
# the design matrices (and large TF-IDF, computed per chunk) stay a fifth of the size
PREDICT_ROWS = 20_000


@dataclass(frozen=True)
class LabelingResult:
    soft: SoftLabels  # multi-label: probs are independent per class (rows need not sum to 1)
    hard: np.ndarray  # (n,) class index, ABSTAIN where the aggregator gives no label; multi-label: (n, k) 0/1
    n_votes: np.ndarray  # (n,) non-abstaining votes per row
    dev_scores: DevScores = field(default_factory=DevScores)  # dev out-of-fold figures, and auto's choice
    dev_oof_probs: np.ndarray | None = None  # (n_dev, k)
    threshold: float | None = None  # multi-label only: the probability a class needs to be predicted


def predict_rows(model, votes: np.ndarray, features: dict | None, chunk: int = PREDICT_ROWS) -> np.ndarray:
    """`model.predict_proba` of every row, `chunk` rows at a time. Rows computed on demand (large TF-IDF) stay
    so per chunk: only a model that reads them computes them."""
    if len(votes) <= chunk:
        return model.predict_proba(votes, features)

    def part(matrix, rows: slice):
        return matrix.subset(rows) if hasattr(matrix, "subset") else matrix[rows]
    parts = []
    for start in range(0, len(votes), chunk):
        rows = slice(start, start + chunk)
        parts.append(model.predict_proba(votes[rows], {name: part(m, rows) for name, m in features.items()}
                                         if features else None))
    return np.concatenate(parts)


def hard_labels(name: str, probs: np.ndarray, n_votes: np.ndarray) -> np.ndarray:
    """(n,) class index per row; a vote-only aggregator gives ABSTAIN where nobody voted."""
    hard = probs.argmax(axis=1)
    if aggregator_entry(name).votes_only:  # it gives no label where nobody voted
        hard = np.where(n_votes > 0, hard, ABSTAIN)
    return hard


def fit_on_dev(model, name: str, votes: np.ndarray, y: np.ndarray, features: dict | None, audit: np.ndarray,
         votes_selected: bool, unlabeled: tuple[np.ndarray, dict | None] | None = None):
    """Fit on labeled dev rows. Only `auto` reads the audit mask (it chooses its ingredient there), whether
    the pool was selected on these rows (then, without audit rows, it leaves the votes-only ingredients out)
    and the unlabeled pool rows' votes and features (a student learns from them; no label is read there)."""
    extra: dict = {}
    if aggregator_entry(name).chooses:
        extra = {"audit": audit, "votes_selected": votes_selected}
        if unlabeled is not None:
            extra.update(unlabeled_votes=unlabeled[0], unlabeled_X=unlabeled[1])
    return model.fit(votes, None if aggregator_entry(name).fits_unlabeled else y, features, **extra)


def dev_oof(name: str, n_classes: int, votes: np.ndarray, y: np.ndarray, features: dict | None,
            seed: int = 0, n_splits: int = 5, audit: np.ndarray | None = None,
            votes_selected: bool = False, unlabeled: tuple[np.ndarray, dict | None] | None = None) -> np.ndarray:
    """Out-of-fold dev probabilities: each fold is predicted by a model that never saw its labels."""
    audit = np.zeros(len(y), dtype=bool) if audit is None else np.asarray(audit, dtype=bool)
    probs = np.zeros((len(y), n_classes))
    for train, held in make_folds(y, n_splits=n_splits, seed=seed):
        model = make_aggregator(name, n_classes, seed)
        fit_on_dev(model, name, votes[train], y[train], take_rows(features or None, train), audit[train],
             votes_selected, unlabeled)
        probs[held] = model.predict_proba(votes[held], take_rows(features or None, held))
    return probs


def student_unlabeled_rows(frame: pd.DataFrame, chooses: bool, seed: int, n_classes: int) -> np.ndarray:
    """Positions in `frame` of the pool rows a chooser (`auto`) hands its student: the seeded sample of them it reads
    (its sample and its offsets' rows); none for any other aggregator. `export` and the corpus labeler both take
    their rows from here, so on a large pool they fit the same student and give the same labels."""
    if not chooses:
        return np.zeros(0, dtype=int)
    unl = np.flatnonzero((frame["split"] == "pool").to_numpy())
    return unl[auto_unlabeled_sample(len(unl), seed, n_classes)]


def fixed_model_estimate(y: np.ndarray, predicted: np.ndarray, n_classes: int, audit: np.ndarray,
                         on_selected_votes: bool, seed: int = 0) -> Estimate | None:
    """The estimate of an aggregator that chooses nothing, from its out-of-fold dev predictions: on every dev row,
    or, when it reads votes the pool was chosen for on these rows, on the audit rows alone (None without them)."""
    if not on_selected_votes:
        return estimate_macro_f1(y, predicted, n_classes, "dev", seed)
    if not audit.any():
        return None
    return estimate_macro_f1(y[audit], predicted[audit], n_classes, AUDIT, seed)


def labeling_inputs(store: Store, executor: Executor, splits: tuple[str, ...] | None, aggregator: str,
                    on_event: EventSink = quiet, kinds: tuple[str, ...] | None = None):
    """The rows of `splits` (None: all) as a frame in import order, the pool's votes on them and the text features
    `aggregator` reads: what every labeling fits and predicts from."""
    pool = store.pool_ids()
    if not pool and aggregator_entry(aggregator).votes_only:
        raise ValueError("the pool is empty: run a generation (or approve an annotator) first")
    for split in splits or ("dev", "test", "pool"):
        if store.count_examples(split):
            ensure_votes(store, executor, pool, split, on_event)
    everything = store.examples_frame()
    frame = everything if splits is None else everything[everything["split"].isin(splits)].reset_index(drop=True)
    ids = list(frame["id"])
    votes = store.vote_matrix(pool, example_ids=ids).votes
    if kinds is None:
        kinds = feature_kinds(store.load_task(), aggregator)
    # TF-IDF learns its vocabulary from every row's text, so `evaluate` on dev and `soft_labels` agree
    fit_frame = everything if len(frame) < len(everything) else None  # a subset: fit on all, transform these
    features = text_features(store, frame, kinds, on_event, fit_frame) if kinds else None
    return frame, ids, votes, features


def fit_and_predict(store: Store, executor: Executor, aggregator: str, splits: tuple[str, ...] | None = None,
                    seed: int = 0, on_event: EventSink = quiet, score_dev: bool = True,
                    threshold: float = THRESHOLD) -> LabelingResult:
    """Fit `aggregator` on dev and label the rows of `splits` (None: every row).

    With `score_dev` the dev rows get out-of-fold predictions and dev scores (five more fits); without
    it (scoring another split) they keep the in-sample fit and `dev_scores` holds no figures.
    `threshold` is read on multi-label tasks only.
    """
    aggregator_entry(aggregator)  # an unknown name fails here, before any work
    task = store.load_task()
    if task.multi_label:
        return _fit_and_predict_multi(store, executor, aggregator, splits, seed, on_event, score_dev, threshold)
    n_classes = len(task.labels)
    wanted = splits
    chooses = aggregator_entry(aggregator).chooses  # may teach a student on the unlabeled rows
    if chooses and splits is not None and "pool" not in splits and store.count_examples("pool"):
        splits = (*splits, "pool")  # the student stage learns from the unlabeled rows; they are dropped below
    if chooses:  # its fits run on worker processes: start them while the features are read
        prewarm_workers(store.count_examples("dev"), n_classes)
    frame, ids, votes, features = labeling_inputs(store, executor, splits, aggregator, on_event)
    unl = student_unlabeled_rows(frame, chooses, seed, n_classes)
    unlabeled = (votes[unl], take_rows(features or None, unl)) if len(unl) else None
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    y_dev = frame["label"].to_numpy()[dev].astype(int)
    audit = frame["audit"].to_numpy(dtype=bool)[dev]
    votes_selected = store.last_complete_generation() > 0  # the gate chose the pool on these dev rows
    on_event(EventKind.AGGREGATING, {"aggregator": aggregator, "rows": len(ids)})
    model = make_aggregator(aggregator, n_classes, seed)
    if aggregator_entry(aggregator).fits_unlabeled:
        model.fit(votes, None, features)
    else:
        fit_on_dev(model, aggregator, votes[dev], y_dev, take_rows(features or None, dev), audit,
             votes_selected, unlabeled)
    probs = predict_rows(model, votes, features)
    fitted: Any = model  # auto's fitted attributes (oof_proba_, chosen_, judged_on_, estimate_), read where present
    oof, dev_scores = None, DevScores()
    if score_dev and unlabeled is not None and getattr(model, "oof_proba_", np.zeros(0)).shape[0] == len(dev):
        # auto with the pool rows: its chosen model's own out-of-fold probabilities (the choice was made on
        # the same folds, so slightly optimistic); five nested refits with students took minutes per dataset
        oof = fitted.oof_proba_
        probs[dev] = oof
    elif score_dev:
        oof = dev_oof(aggregator, n_classes, votes[dev], y_dev, take_rows(features or None, dev), seed,
                      audit=audit, votes_selected=votes_selected, unlabeled=unlabeled)
        probs[dev] = oof
    n_votes = (votes != ABSTAIN).sum(axis=1)
    hard = hard_labels(aggregator, probs, n_votes)
    if score_dev:
        assert oof is not None  # both branches above set it when score_dev
        dev_scores = DevScores(macro_f1=round(macro_f1(y_dev, hard[dev], n_classes), 4),
                               accuracy=round(accuracy(y_dev, hard[dev]), 4),
                               ece=round(expected_calibration_error(y_dev, oof), 4), n=int(len(dev)))
        if audit.any():  # the honest figure: rows the agents and the gate never saw
            dev_scores = dataclasses.replace(
                dev_scores, audit_macro_f1=round(macro_f1(y_dev[audit], hard[dev][audit], n_classes), 4),
                n_audit=int(audit.sum()))
    uses_pool = bool(getattr(model, "uses_votes_", aggregator_entry(aggregator).reads_votes)) and votes.shape[1] > 0
    if hasattr(model, "chosen_"):  # judged_on_: where what reads the pool was judged ("audit" rows, or "dev")
        dev_scores = dataclasses.replace(dev_scores, choice=AutoChoice(fitted.chosen_, fitted.judged_on_),
                                         estimate=fitted.estimate_)
    elif oof is not None:
        dev_scores = dataclasses.replace(dev_scores, estimate=fixed_model_estimate(
            y_dev, oof.argmax(axis=1), n_classes, audit, uses_pool and votes_selected, seed))
    dev_scores = dataclasses.replace(dev_scores, uses_pool=uses_pool)
    if dev_scores.estimate is not None and features and "embedding" in features:
        gain = learning_curve_gain(y_dev, take_rows(features, dev)["embedding"], n_classes, seed)
        dev_scores = dataclasses.replace(dev_scores, estimate=dev_scores.estimate.shifted(gain))
    if wanted is not None and len(ids) != sum(store.count_examples(s) for s in wanted):
        keep = np.flatnonzero(frame["split"].isin(wanted).to_numpy())  # drop the rows only the student read
        probs, hard, n_votes = probs[keep], hard[keep], n_votes[keep]
        ids = [ids[i] for i in keep]
    made_by = f"auto:{model.chosen_}" if hasattr(model, "chosen_") else aggregator  # what the export names
    return LabelingResult(SoftLabels(probs, tuple(ids), made_by), hard, n_votes, dev_scores, oof)


def _fit_and_predict_multi(store: Store, executor: Executor, aggregator: str, splits: tuple[str, ...] | None,
                           seed: int, on_event: EventSink, score_dev: bool, threshold: float) -> LabelingResult:
    """fit_and_predict for a multi-label task: MultiLabelEvoAgg fitted on dev label sets, 5-fold OOF dev."""
    if aggregator_entry(aggregator).votes_only:
        raise ValueError(f"{aggregator!r} gives one label per row and cannot label a multi-label task; use "
                         "'evoagg', 'auto' or 'auto-pool' (all MultiLabelEvoAgg), or 'embedding' (the text alone)")
    k = len(store.load_task().labels)
    frame, ids, votes, features = labeling_inputs(store, executor, splits, aggregator, on_event, kinds=("embedding",))
    # a text-only aggregator ("embedding") is the same model without the votes
    used = votes if aggregator_entry(aggregator).reads_votes else votes[:, :0]
    dev = np.flatnonzero((frame["split"] == "dev").to_numpy())
    position = {e: i for i, e in enumerate(store.example_ids("dev"))}
    Y_dev = store.label_matrix("dev")[[position[e] for e in frame["id"].to_numpy()[dev]]]
    audit = frame["audit"].to_numpy(dtype=bool)[dev]
    dev_features = take_rows(features, dev)
    on_event(EventKind.AGGREGATING, {"aggregator": aggregator, "rows": len(ids)})
    probs = MultiLabelEvoAgg(k, seed=seed).fit(used[dev], Y_dev, dev_features).predict_proba(used, features)
    oof, dev_scores = None, DevScores()
    if score_dev:
        first = frame["label"].to_numpy()[dev].astype(int)  # folds stratified by each row's first label
        oof = oof_proba(lambda: MultiLabelEvoAgg(k, seed=seed), used[dev], Y_dev, dev_features,
                        make_folds(first, n_splits=5, seed=seed))
        probs[dev] = oof
    hard = predict_labels(probs, threshold)
    if score_dev:
        scores: dict[str, Any] = multilabel_scores(Y_dev, hard[dev])
        dev_scores = DevScores(**scores, n=int(len(dev)), threshold=threshold)
        if audit.any():
            dev_scores = dataclasses.replace(
                dev_scores, audit_macro_f1=multilabel_scores(Y_dev[audit], hard[dev][audit])["macro_f1"],
                n_audit=int(audit.sum()))
    entry = aggregator_entry(aggregator)
    if entry.evoagg_on_multi_label:
        dev_scores = dataclasses.replace(dev_scores, choice=AutoChoice("evoagg"))
    dev_scores = dataclasses.replace(dev_scores, uses_pool=entry.reads_votes)
    n_votes = (votes != ABSTAIN).sum(axis=1)
    made_by = "auto:evoagg" if entry.evoagg_on_multi_label else aggregator
    return LabelingResult(SoftLabels(probs, tuple(ids), made_by), hard, n_votes, dev_scores, oof, threshold)


def multilabel_scores(Y: np.ndarray, hard: np.ndarray) -> dict[str, float]:
    """Macro-F1 (per-class binary F1 averaged), micro-F1 and exact-match accuracy of (n, k) 0/1 label sets."""
    macro, micro = multilabel_f1(Y, hard)
    return {"macro_f1": round(macro, 4), "micro_f1": round(micro, 4), "exact_match": round(exact_match(Y, hard), 4)}


def soft_labels(store: Store, executor: Executor, aggregator: str = "auto", seed: int = 0,
                on_event: EventSink = quiet, threshold: float = THRESHOLD) -> LabelingResult:
    """Soft labels for every row of the workspace (what `export` writes)."""
    return fit_and_predict(store, executor, aggregator, None, seed, on_event, threshold=threshold)
