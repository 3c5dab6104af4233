"""Pseudo-labels for the agents' pool sample: more evidence about an annotator than dev's few rows.

An annotator mined and kept on a few hundred dev rows looks better there than anywhere else (5 of 5 on dev,
60 % on new data). A text classifier fitted on the same dev rows knows nothing about which cues were picked,
so how often it agrees with an annotator's vote on the hundreds of pool rows it fires on is an independent
estimate of that annotator's precision. On banking77 (seed 0, pool rows scored with their withheld train
labels) that agreement tracked true precision with correlation 0.97 against 0.73 for the dev precision
(mean error 0.05 against 0.20); on ChemProt, where the text model is weak, 0.36 against 0.38. So the
estimate is weighed by how well the classifier itself does out of fold on dev (`PseudoLabels.evidence`).

Only the fitness rows' labels are read (never audit or test rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine.aggregators.base import make_folds
from engine.aggregators.evoagg import TextOnly
from engine.domain import Example
from engine.text_views import task_views, view_text

if TYPE_CHECKING:
    from engine.store.workspace import Store

# the static table distilled from the packaged MiniLM (engine/embed/static.py): ~15k texts/s here, against tens
# per second for MiniLM itself, and nearly as good a measuring stick (banking77: correlation 0.96 against 0.97)
PSEUDO_EMBEDDER = "static"
PSEUDO_C = 1.0  # one C, no inner search: the classifier is a measuring stick, not the product's labeler
MAX_WEIGHT_ROWS = 200  # pool rows beyond this add no weight: the classifier's own errors set a floor
_fitted: dict[tuple, tuple[TextOnly, float]] = {}  # (workspace, embedder, dev rows, seed) -> (model, accuracy)


@dataclass(frozen=True)
class PseudoLabels:
    """A dev-fitted text classifier's guesses for the pool sample, and how often it is right on dev."""

    proba: np.ndarray  # (n_pool_sample, k) class probabilities, rows in pool-sample order
    accuracy: float  # its out-of-fold accuracy on the fitness rows

    @property
    def guess(self) -> np.ndarray:
        return self.proba.argmax(axis=1)

    def evidence(self, fired: np.ndarray, label: int) -> tuple[float, float]:
        """(precision estimate, weight in rows) for an annotator voting `label` on the `fired` pool rows
        (a mask over the first len(fired) rows of the sample).

        The classifier agrees with a right vote with probability ~accuracy and with a wrong one ~e (its
        errors spread over the other classes), so agreement a = p*acc + (1-p)*e gives p = (a-e)/(acc-e).
        The weight is the pool support discounted by how much that agreement can say: none at chance.
        """
        n = int(np.count_nonzero(fired))
        k = self.proba.shape[1]
        chance = 1.0 / k
        if n == 0 or self.accuracy <= chance:
            return 0.0, 0.0
        agree = float(np.mean(self.guess[: len(fired)][fired] == label))
        error = (1.0 - self.accuracy) / max(k - 1, 1)
        estimate = float(np.clip((agree - error) / (self.accuracy - error), 0.0, 1.0))
        strength = ((self.accuracy - chance) / (1.0 - chance)) ** 2
        return estimate, min(n, MAX_WEIGHT_ROWS) * strength


def pseudo_label(store: Store, dev: Sequence[Example], pool_sample: Sequence[Example],
                 seed: int = 0) -> PseudoLabels | None:
    """Fit a text classifier on the labeled dev rows (sentence embeddings) and guess the pool sample.

    None when there is nothing to guess or too little to fit (fewer than two classes, no pool rows)."""
    labeled = [ex for ex in dev if ex.label is not None]
    task = store.load_task()
    if not pool_sample or len(labeled) < 10 or task is None or task.multi_label:
        return None
    y = np.array([ex.label for ex in labeled], dtype=np.int64)
    if np.unique(y).size < 2:
        return None
    from engine.embed.registry import get_embedder

    embedder = get_embedder(PSEUDO_EMBEDDER)
    relation = "between" in task_views(tuple(task.fields) or tuple(labeled[0].fields))
    key = (str(store.path), embedder.name, tuple((ex.id, ex.label, ex.text) for ex in labeled), seed)
    if key not in _fitted:  # dev rarely changes between generations: fit once, guess each new sample
        X_dev = _features(embedder, labeled, relation)
        _fitted.clear()
        _fitted[key] = _fit(X_dev, y, len(task.labels), seed)
    model, accuracy = _fitted[key]
    X_pool = _features(embedder, pool_sample, relation)
    return PseudoLabels(model.predict_proba(np.zeros((len(pool_sample), 0), dtype=np.int64), X_pool), accuracy)


def _features(embedder, examples: Sequence[Example], relation: bool) -> np.ndarray:
    """The sentence's embedding and, on relation tasks, the embedding of the words between the two entities
    (SemEval seed 0: the classifier's pool accuracy 0.63 -> 0.77 with them, ChemProt 0.38 -> 0.47)."""
    X = embedder.encode([ex.text for ex in examples])
    if relation:
        X = np.hstack([X, embedder.encode([view_text(ex.as_input(), "between") for ex in examples])])
    return X


def _fit(X: np.ndarray, y: np.ndarray, k: int, seed: int) -> tuple[TextOnly, float]:
    """The classifier on all labeled rows, and its 3-fold out-of-fold accuracy."""
    votes = np.zeros((len(y), 0), dtype=np.int64)

    def fit(rows: np.ndarray) -> TextOnly:
        return TextOnly(k, feature="x", Cs=(PSEUDO_C,), seed=seed).fit(votes[rows], y[rows], X[rows])

    guessed = np.full(len(y), -1)
    for train, held in make_folds(y, 3, seed):
        guessed[held] = fit(train).predict_proba(votes[held], X[held]).argmax(axis=1)
    accuracy = float(np.mean(guessed == y)) if (guessed >= 0).any() else 0.0
    return fit(np.arange(len(y))), accuracy
