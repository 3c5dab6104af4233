"""The expert grows dev: the dev rows the labels get wrong (a regression list), unlabeled rows like one of them,
and rows the expert labels in the studio joining dev with a record of who and when, so small classes grow.

A labeled row joins dev's fitness rows (never audit or test): the agents and the gate see it from the next
generation on. Every annotator that was run on dev gets its vote on the row (from its stored pool run, else a
sandbox run on just those rows) and its dev score is recomputed, so every screen's figures include the row.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from engine.apply.votes import frame_inputs, rescore_on_fitness
from engine.domain import ABSTAIN, FITNESS
from engine.sandbox.executor import Executor
from engine.store.workspace import Store

SIMILAR_SCAN = 20_000  # unlabeled rows compared with a regression row (the first ones, in import order)


def regression_rows(store: Store, example_ids: Sequence[str], probs: np.ndarray, hard: np.ndarray) -> pd.DataFrame:
    """Fitness rows whose label (out-of-fold, as saved soft labels give dev rows) is not the gold one: id, text,
    gold, predicted, confidence, sorted with the most confident mistakes first. A multi-label row is wrong when its
    predicted set differs from the gold set. An unlabeled prediction ("") counts as wrong. Audit rows are left out:
    labeling rows like them would steer the fitness rows toward the rows held back to check the pool honestly."""
    labels = store.load_task().labels
    frame = store.examples_frame(FITNESS)
    position = pd.Series(np.arange(len(example_ids)), index=pd.Index(list(example_ids)))
    keep = frame["id"].isin(position.index).to_numpy()
    frame = frame[keep].reset_index(drop=True)
    rows = position[frame["id"]].to_numpy()
    gold = store.gold(FITNESS)[keep]
    p, h = probs[rows], hard[rows]

    def names(row: np.ndarray | int) -> str:
        if np.ndim(row):
            return ", ".join(labels[c] for c in np.flatnonzero(row))
        return labels[int(row)] if row != ABSTAIN else ""

    if h.ndim == 2:
        wrong = (h.astype(bool) != gold.astype(bool)).any(axis=1)
        sure = np.maximum(p, 1 - p).min(axis=1)
    else:
        wrong = h != gold
        sure = np.where(h != ABSTAIN, p.max(axis=1), 0.0)
    out = pd.DataFrame({"id": frame["id"][wrong].to_numpy(), "text": frame["text"][wrong].to_numpy(),
                        "gold": [names(g) for g in gold[wrong]], "predicted": [names(x) for x in h[wrong]],
                        "confidence": sure[wrong].round(3)})
    return out.sort_values("confidence", ascending=False, kind="stable").reset_index(drop=True)


def similar_rows(store: Store, text: str, n: int = 10, scan: int = SIMILAR_SCAN,
                 likeness: PoolLikeness | None = None) -> pd.DataFrame:
    """The unlabeled rows most like `text` by TF-IDF cosine (words and bigrams): id, text, similarity (`likeness`:
    one fitted before, as the studio keeps one per state of the rows)."""
    return (likeness or PoolLikeness(store, scan)).like([text], n)


def rows_of_class(store: Store, label_id: int, n: int = 10, saved: tuple[Sequence[str], np.ndarray] | None = None,
                  scan: int = SIMILAR_SCAN, likeness: PoolLikeness | None = None) -> pd.DataFrame:
    """The unlabeled rows most likely to be of class `label_id`, for the expert to label into dev (a thin class
    grows fastest from rows that are likely its own). Ranked by the saved soft labels' probability of the class
    when `saved` = (example ids, probabilities) is given: columns id, text, probability. Without them, by
    `PoolLikeness.rank` (fitted here unless given: the studio keeps one per state of the rows): columns id, text,
    similarity."""
    if saved is None:
        return (likeness or PoolLikeness(store, scan)).rank(store, label_id, n)
    example_ids, probs = saved
    unlabeled = set(store.example_ids("pool"))  # rows labeled into dev since the labels were saved drop out
    rows = np.array([i for i, e in enumerate(example_ids) if e in unlabeled], dtype=int)
    p = probs[rows, label_id] if len(rows) else np.zeros(0)
    best = rows[np.argsort(-p, kind="stable")[:n]]
    ids = [example_ids[i] for i in best]
    text = store.examples_frame("pool", ids=ids).set_index("id")["text"]
    return pd.DataFrame({"id": ids, "text": [text[i] for i in ids], "probability": probs[best, label_id].round(3)})


class PoolLikeness:
    """The first `scan` unlabeled rows' TF-IDF (words and bigrams), fitted once: `like` orders them by likeness to
    some texts taken together (a wrong dev row's: `similar_rows`), `rank` to a class's fitness rows or, when it has
    none, to its name and description, read from the store at each call (a description saved since counts). Fitting
    is the cost (seconds at 20,000 long rows); ranking is a product."""

    def __init__(self, store: Store, scan: int = SIMILAR_SCAN):
        from sklearn.feature_extraction.text import TfidfVectorizer

        frame = store.examples_frame("pool", limit=scan)
        self.ids, self.texts = frame["id"].to_numpy(), frame["text"].to_numpy()
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
        self.matrix = self.vectorizer.fit_transform(frame["text"].astype(str)) if len(frame) else None

    def like(self, queries: Sequence[str], n: int = 10) -> pd.DataFrame:
        """The `n` rows nearest the mean TF-IDF vector of `queries` (none that shares no word): id, text, similarity."""
        if self.matrix is None:
            return pd.DataFrame(columns=["id", "text", "similarity"])
        centre = np.asarray(self.vectorizer.transform(list(queries)).mean(axis=0)).ravel()
        similarity = self.matrix @ centre
        best = np.argsort(-similarity, kind="stable")[:n]
        best = best[similarity[best] > 0]
        return pd.DataFrame({"id": self.ids[best], "text": self.texts[best], "similarity": similarity[best].round(3)})

    def rank(self, store: Store, label_id: int, n: int = 10) -> pd.DataFrame:
        gold = store.gold(FITNESS)
        of_class = gold[:, label_id] == 1 if gold.ndim == 2 else gold == label_id
        queries = list(store.examples_frame(FITNESS)["text"].astype(str).to_numpy()[of_class])
        if not queries:
            task = store.load_task()
            label = task.labels[label_id]
            described = str(task.label_descriptions.get(label, ""))
            queries = [" ".join([label.replace("_", " ").replace("-", " "), described])]
        return self.like(queries, n)


def _class_ids(store: Store, labeled: Mapping[str, str | Sequence[str]]) -> list[tuple[str, int, list[int] | None]]:
    """Label names → (id, class id, label set on a multi-label task); an unknown name is an error."""
    task = store.load_task()
    index = {name: i for i, name in enumerate(task.labels)}
    out = []
    for example_id, given in labeled.items():
        names = [given] if isinstance(given, str) else list(given)
        unknown = [g for g in names if g not in index]
        if unknown or not names:
            raise ValueError(f"row {example_id}: {unknown or 'no label'} not in the label set {list(task.labels)}")
        if len(names) > 1 and not task.multi_label:
            raise ValueError(f"row {example_id}: one label per row on a single-label task, got {names}")
        ids = sorted(index[g] for g in names)
        out.append((str(example_id), ids[0], ids if task.multi_label else None))
    return out


def label_rows(store: Store, executor: Executor, labeled: Mapping[str, str | Sequence[str]], by: str,
               note: str = "") -> list[str]:
    """The expert labels unlabeled rows: they join dev's fitness rows (who, when and `note` recorded), every
    annotator run on dev gets its vote on them, and dev scores are recomputed. Returns the ids that moved (rows
    not in the unlabeled pool are left alone: test rows stay holdout)."""
    entries = _class_ids(store, labeled)
    if not by.strip():
        raise ValueError("Say who labeled the rows (your name): it is recorded with them.")
    pool_rows = store.examples_frame("pool", ids=[e[0] for e in entries])
    moving = [e for e in entries if e[0] in set(pool_rows["id"])]
    if not moving:
        return []
    store.move_to_dev(moving, by.strip(), note)
    ids = [e[0] for e in moving]
    try:
        # read after the move: a dev run saved meanwhile is either in this list or voted on the rows by its own
        # catch-up
        annotators = store.annotators_with_votes("dev")
        unvoted = [a for a in store.annotators(annotators) if "pool" not in store.voted_splits(a.id)]
        if unvoted:
            task = store.load_task()
            frame = store.examples_frame("dev", ids=ids)
            for annotator, result in zip(unvoted, executor.run(unvoted, frame_inputs(frame), list(task.labels)),
                                         strict=True):
                store.add_votes(annotator.id, list(frame["id"]), result.votes)
        rescore_on_fitness(store, annotators)
    except BaseException as failure:
        # all or nothing: rows in dev that some annotator never voted on, or scores half recomputed, would be
        # figures no one can trust; the rows go back unlabeled (as the undo returns them) and the error stands
        said = f"labeling failed ({type(failure).__name__}: {failure})"
        try:
            store.move_back_to_pool(ids)
        except Exception as undo_failure:
            raise RowsLeftInDev(f"{said} and returning the rows to the pool failed too ({type(undo_failure).__name__}: "
                                f"{undo_failure}): {len(ids)} row(s) are in dev; send them back from the record of "
                                "labeled rows") from failure
        try:
            rescore_on_fitness(store, store.annotators_with_votes("dev"))
        except Exception as rescore_failure:
            raise RuntimeError(f"{said}; the rows are back in the pool, but the dev scores could not be recomputed "
                               f"({type(rescore_failure).__name__}: {rescore_failure}): label or send back any row to "
                               "recompute them") from failure
        raise
    return ids


class RowsLeftInDev(RuntimeError):
    """A labeling failed midway and its rows could not be returned to the pool: they stand in dev."""


def unlabel_rows(store: Store, example_ids: Sequence[str]) -> list[str]:
    """Undo `label_rows`: these rows go back to the unlabeled pool (label and record dropped) and dev scores are
    recomputed without them. Only rows the expert labeled into dev move. Returns the ids that moved."""
    moved = store.move_back_to_pool(example_ids)
    if moved:
        rescore_on_fitness(store, store.annotators_with_votes("dev"))
    return moved
