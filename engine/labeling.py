"""From the pool's votes to soft labels: features, fitting on dev, honest dev scores, evaluation.

Aggregators are fitted on dev labels only (Dawid–Skene, which needs no labels, on every row's votes).
Dev rows get out-of-fold predictions, so every dev figure the studio or CLI shows is honest.
Test labels are read only by `evaluate(split="test")`, after fitting.
A multi-label task is labeled by MultiLabelEvoAgg (one binary model per class; "evoagg", "auto" and "auto-pool"
all name it, "embedding" is it without the votes); a row gets every class whose probability reaches `threshold`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from engine.aggregators.base import make_folds, oof_proba, take_rows
from engine.aggregators.features import RELATION_NGRAMS, join_unit_rows, tfidf_rows
from engine.aggregators.learning_curve import learning_curve_gain
from engine.aggregators.parallel import prewarm_workers
from engine.aggregators.registry import (
    AGGREGATORS,
    DEFAULT_AGGREGATOR,
    MultiLabelEvoAgg,
    aggregator_entry,
    expected_calibration_error,
    make_aggregator,
    predict_labels,
)
from engine.aggregators.student import auto_unlabeled_sample
from engine.apply.votes import ensure_votes
from engine.domain import ABSTAIN, AUDIT, AutoChoice, DevScores, Estimate, SoftLabels, Task
from engine.embed.base import Embedder
from engine.events import EventKind, EventSink, quiet
from engine.metrics.estimate import estimate_macro_f1
from engine.metrics.score import accuracy, exact_match, macro_f1, majority_vote, multilabel_f1
from engine.sandbox.executor import Executor
from engine.store.workspace import Store
from engine.text_views import masked_views, relation_context, task_views

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


def aggregators_for(task: Task) -> tuple[str, ...]:
    """The aggregators a task can use: vote-only ones give one label per row, so none of them is multi-label."""
    return tuple(a for a in AGGREGATORS if not (task.multi_label and aggregator_entry(a).votes_only))


def feature_kinds(task: Task, aggregator: str) -> tuple[str, ...]:
    """The text views an aggregator reads. `auto` weighs them all: sentence embeddings, TF-IDF n-grams and,
    on relation tasks (two entity spans), TF-IDF of the words between and around the mentions marked by place, the
    classic relation cue that a whole-sentence embedding dilutes, and embeddings of the sentence with the mentions
    masked."""
    if aggregator_entry(aggregator).chooses:
        relation = "between" in task_views(task.fields)
        return ("embedding", "tfidf") + (("relation", "masked") if relation else ())
    return ("embedding",) if aggregator_entry(aggregator).reads_text else ()


def distinct_pairs(frame: pd.DataFrame) -> tuple[list[int], np.ndarray]:
    """The row position of each distinct (text, spans), in first-occurrence order, and each row's index among them.
    The relation views read nothing else of a row, and a corpus repeats them (100K rows resampled from ChemProt's
    train split hold at most its 12,861): each is worked out once per distinct pair."""
    position: dict[tuple[str, str, str], int] = {}
    first: list[int] = []
    inverse = np.empty(len(frame), dtype=np.int64)
    for row, (fields, text) in enumerate(zip(frame["fields"], frame["text"], strict=True)):
        key = (text, repr(fields.get("span1")), repr(fields.get("span2")))
        index = position.setdefault(key, len(position))
        if index == len(first):
            first.append(row)
        inverse[row] = index
    return first, inverse


def relation_texts(frame: pd.DataFrame, distinct: tuple[list[int], np.ndarray] | None = None) -> list[str]:
    """Each row's `relation_context`: the words between and around its two entity mentions, marked by place.
    `distinct`: `distinct_pairs(frame)`, when the caller has it."""
    first, inverse = distinct or distinct_pairs(frame)
    fields, texts = frame["fields"].to_numpy(), frame["text"].to_numpy()
    context = [relation_context({**fields[row], "text": texts[row]}) for row in first]
    return [context[index] for index in inverse]


def text_features(store: Store, frame: pd.DataFrame, kinds: tuple[str, ...],
                  on_event: EventSink = quiet, fit_frame: pd.DataFrame | None = None,
                  embedder: Embedder | None = None) -> dict[str, object]:
    """Named feature matrices for the rows of `frame`: sentence embeddings (cached in the workspace), TF-IDF
    of the text and, for "relation", TF-IDF of the words between and around the two entity mentions. The TF-IDF
    vocabularies are fitted on `fit_frame`'s texts (default: `frame`'s): pass every row of the workspace so a
    row gets the same features whichever splits are being labeled (no label is read there)."""
    texts = list(frame["text"])
    fit_texts = None if fit_frame is None else list(fit_frame["text"])
    out: dict[str, object] = {}
    if "embedding" in kinds:
        from engine.embed.cache import embed_texts
        from engine.embed.registry import workspace_embedder

        def progress(done: int, total: int) -> None:
            on_event(EventKind.EMBEDDING, {"done": done, "total": total})

        out["embedding"] = embed_texts(store, texts, embedder or workspace_embedder(store), progress)
    if "tfidf" in kinds:
        out["tfidf"] = tfidf_rows(texts, fit_texts=fit_texts)
    distinct = distinct_pairs(frame) if {"masked", "relation"} & set(kinds) else None
    if "masked" in kinds:
        out["masked"] = masked_embeddings(store, frame, on_event, distinct, embedder)
    if "relation" in kinds:
        context = relation_texts(frame, distinct)
        if any(context):  # no well-formed entity pair anywhere: no such view to learn from
            out["relation"] = tfidf_rows(context, fit_texts=None if fit_frame is None else relation_texts(fit_frame),
                                         word_ngrams=RELATION_NGRAMS)
    return out


def warm_embeddings(store: Store, on_event: EventSink = quiet) -> int:
    """Embed every row the way the default labels will read it (the sentence, and on relation tasks its masked
    views), into the workspace's cache, so the soft labels need not wait for it. Returns the rows covered."""
    from engine.embed.registry import workspace_embedder

    kinds = tuple(k for k in feature_kinds(store.load_task(), DEFAULT_AGGREGATOR) if k in ("embedding", "masked"))
    frame = store.examples_frame()
    embedder = workspace_embedder(store)
    if hasattr(embedder, "num_threads"):  # one core for the work ahead, the other for the screens the expert uses
        embedder.num_threads = 1
    text_features(store, frame, kinds, on_event, embedder=embedder)
    return len(frame)


def masked_embeddings(store: Store, frame: pd.DataFrame, on_event: EventSink = quiet,
                      distinct: tuple[list[int], np.ndarray] | None = None,
                      embedder: Embedder | None = None) -> np.ndarray:
    """The "masked" feature of relation tasks: sentence embeddings of the two `masked_views` (mentions replaced
    by X and Y; the sentence, and the part between the mentions), joined. Cached in the workspace like any text."""
    from engine.embed.cache import embed_texts
    from engine.embed.registry import workspace_embedder

    first, inverse = distinct or distinct_pairs(frame)  # joined once per distinct pair, then spread to its rows
    fields, texts = frame["fields"].to_numpy(), frame["text"].to_numpy()
    pairs = [masked_views({**fields[row], "text": texts[row]}) for row in first]
    embedder = embedder or workspace_embedder(store)

    def progress(part: int) -> Callable[[int, int], None]:
        """One count over both views' texts: each call of `embed_texts` counts its own from 0."""
        def report(done: int, total: int) -> None:
            on_event(EventKind.EMBEDDING, {"done": part * total + done, "total": 2 * total, "view": "masked"})
        return report

    joined = join_unit_rows(*(embed_texts(store, [p[i] for p in pairs], embedder, progress(i)) for i in (0, 1)))
    return joined if len(first) == len(frame) else joined[inverse]


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
