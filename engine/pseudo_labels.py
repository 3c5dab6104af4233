"""Pseudo-labels for the agents' pool sample: more evidence about an annotator than dev's few rows.

An annotator mined and kept on a few hundred dev rows looks better there than anywhere else (5 of 5 on dev,
60 % on new data). A text classifier fitted on the same dev rows knows nothing about which cues were picked,
so how often it agrees with an annotator's vote on the hundreds of pool rows it fires on is an independent
estimate of that annotator's precision. On banking77 (seed 0, pool rows scored with their withheld train
labels) that agreement tracked true precision with correlation 0.97 against 0.73 for the dev precision
(mean error 0.05 against 0.20); on ChemProt, where the text model is weak, 0.36 against 0.38. So the
estimate is weighed by how well the classifier itself does out of fold on dev (`PseudoLabels.evidence`).

The guesses are also rows to mine: the offline improver looks for cues on the thousands of guessed pool rows and
lets dev judge them (`offline.roles.guessed_label_proposals`), even when the classifier is too weak to be evidence.

Only the fitness rows' labels are read (never audit or test rows).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine.aggregators.base import make_folds
from engine.aggregators.evoagg import TextOnly
from engine.domain import ABSTAIN, Example
from engine.text_views import task_views, view_text

if TYPE_CHECKING:
    from engine.store.workspace import Store

# the static table distilled from the packaged MiniLM (engine/embed/static.py): ~15k texts/s here, against tens
# per second for MiniLM itself, and nearly as good a measuring stick (banking77: correlation 0.96 against 0.97)
PSEUDO_EMBEDDER = "static"
PSEUDO_C = 1.0  # one C, no inner search: the classifier is a measuring stick, not the product's labeler
MAX_WEIGHT_ROWS = 200  # pool rows beyond this add no weight: the classifier's own errors set a floor
# below this share of the way from chance to perfect, the classifier's agreement is not worth reading at all: on
# ChemProt (0.41 of the way) it tracked the pool rows' true precision no better than dev did (0.36 against 0.38;
# auto over seeds 0-2: 0.470 with it, 0.476 without). SemEval 0.83, TREC 0.55, banking77 0.55, SMS 0.95
MIN_OVERALL_SKILL = 0.45
MIN_SKILL = 0.05  # recall minus false rate below this: its agreement on a class says nothing
# what the offline improver writes in the rationale of a cue it mined against these guesses, for the expert: their
# agreement with it is no evidence (it was chosen to agree), so neither its preview nor the gate weighs any; the gate
# reads the candidate's `mined_on_guesses` flag, not these words (engine/evolve.py)
MINED_ON_GUESSES = "mined on the unlabeled sample's guessed labels"
SHRINK_ROWS = 10  # per-class rates lean on the overall ones as if from this many rows (6 dev rows a class is few)
# (workspace, embedder, dev rows, seed) -> (model, accuracy, recall, false rate, dev features)
_fitted: dict[tuple, tuple] = {}
# (dev ids, dev labels, rows refitted on, seed) -> the classifier refitted on those rows
_refits: dict[tuple, TextOnly] = {}


@dataclass(frozen=True)
class PseudoLabels:
    """A dev-fitted text classifier's guesses for the pool sample, and how often it is right on dev."""

    proba: np.ndarray  # (n_pool_sample, k) class probabilities, rows in pool-sample order
    accuracy: float  # its out-of-fold accuracy on the fitness rows
    recall: np.ndarray | None = None  # (k,) out of fold: share of class c's rows it guesses c (None: accuracy)
    false_rate: np.ndarray | None = None  # (k,) share of the other classes' rows it guesses c (None: even spread)
    # False when the classifier is too weak out of fold (`MIN_OVERALL_SKILL`) for its agreement to be evidence
    # about an annotator's precision; its guesses may still point the miners at rows (checked on dev after)
    trusted: bool = True
    # what the classifier was fitted on and reads, so `guess_from` can refit it on some of the dev rows
    dev_X: np.ndarray | None = None  # (n_dev, d) features of the labeled dev rows, in the order given
    dev_y: np.ndarray | None = None  # (n_dev,) their labels
    pool_X: np.ndarray | None = None  # (n_pool_sample, d)
    seed: int = 0
    dev_ids: tuple[str, ...] = ()  # the ids of the labeled dev rows `dev_X` holds, in order

    @property
    def guess(self) -> np.ndarray:
        return self.proba.argmax(axis=1)

    def guess_from(self, rows: np.ndarray) -> np.ndarray:
        """(n_pool_sample,) guesses of the same classifier fitted on these dev rows only (positions among the labeled
        dev rows), so the other rows can judge what is mined from them; all of `guess` when it cannot be refitted."""
        if self.dev_X is None or self.dev_y is None or self.pool_X is None:
            return self.guess
        rows = np.asarray(rows, dtype=np.int64)
        # dev rarely changes between generations: the refit on these rows is kept like the full fit (`_fitted`); keyed
        # on the features too: two workspaces of the studio's one process may share ids (row numbers) and labels
        features = hashlib.sha1(np.ascontiguousarray(self.dev_X[rows]).tobytes()).hexdigest()
        key = (self.dev_ids, self.dev_y.tobytes(), tuple(rows.tolist()), self.seed, features) if self.dev_ids else None
        model = _refits.get(key) if key else None
        if model is None:
            model = TextOnly(self.proba.shape[1], feature="x", Cs=(PSEUDO_C,), seed=self.seed).fit(
                np.zeros((len(rows), 0), dtype=np.int64), self.dev_y[rows], self.dev_X[rows])
            if key:
                if len(_refits) >= 4:  # the two halves of the current dev, and room for a change of dev
                    _refits.clear()
                _refits[key] = model
        return model.predict_proba(np.zeros((len(self.pool_X), 0), dtype=np.int64), self.pool_X).argmax(axis=1)

    def evidence(self, fired: np.ndarray, label: int) -> tuple[float, float]:
        """(precision estimate, weight in rows) for an annotator voting `label` on the `fired` pool rows
        (a mask over the first len(fired) rows of the sample).

        The classifier guesses c on a row of class c with probability r_c (its recall) and on another class's
        row with probability e_c, so an agreement a = p*r_c + (1-p)*e_c gives p = (a - e_c) / (r_c - e_c).
        The weight is the pool support discounted by how much that agreement can say: none when r_c = e_c.
        """
        votes = np.where(fired, label, ABSTAIN)
        return self.evidence_of_votes(votes)

    def evidence_of_votes(self, votes: np.ndarray) -> tuple[float, float]:
        """The same for any annotator's (n,) votes on the first n rows of the sample (ABSTAIN = -1), per class
        it votes, weighted together."""
        if not self.trusted:
            return 0.0, 0.0
        votes = np.asarray(votes)
        guess = self.guess[: len(votes)]
        k = self.proba.shape[1]
        even = (1.0 - self.accuracy) / max(k - 1, 1)
        recall = np.full(k, self.accuracy) if self.recall is None else self.recall
        false_rate = np.full(k, even) if self.false_rate is None else self.false_rate
        total, weight = 0.0, 0.0
        for c in np.unique(votes[votes != ABSTAIN]):
            mine = votes == c
            skill = recall[c] - false_rate[c]
            if skill <= MIN_SKILL:
                continue
            agree = float(np.mean(guess[mine] == c))
            w = min(int(mine.sum()), MAX_WEIGHT_ROWS) * skill ** 2
            total += w * float(np.clip((agree - false_rate[c]) / skill, 0.0, 1.0))
            weight += w
        return (total / weight, weight) if weight else (0.0, 0.0)


def pseudo_label(store: Store, dev: Sequence[Example], pool_sample: Sequence[Example],
                 seed: int = 0) -> PseudoLabels | None:
    """Fit a text classifier on the labeled dev rows (sentence embeddings) and guess the pool sample.

    None when there is nothing to guess or too little to fit (fewer than two classes, no pool rows). A classifier
    too weak out of fold for its agreement to say anything (`MIN_OVERALL_SKILL`) gives untrusted guesses: no
    evidence, but still rows for the improver to mine (dev judges what it finds there)."""
    labeled = [ex for ex in dev if ex.label is not None]
    task = store.find_task()
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
        _fitted[key] = (*_fit(X_dev, y, len(task.labels), seed), X_dev)
    model, accuracy, recall, false_rate, X_dev = _fitted[key]
    k = len(task.labels)
    trusted = (accuracy - 1.0 / k) / (1.0 - 1.0 / k) >= MIN_OVERALL_SKILL
    X_pool = _features(embedder, pool_sample, relation)
    return PseudoLabels(model.predict_proba(np.zeros((len(pool_sample), 0), dtype=np.int64), X_pool), accuracy,
                        recall, false_rate, trusted, X_dev, y, X_pool, seed, tuple(ex.id for ex in labeled))


def _features(embedder, examples: Sequence[Example], relation: bool) -> np.ndarray:
    """The sentence's embedding and, on relation tasks, the embedding of the words between the two entities
    (SemEval seed 0: the classifier's pool accuracy 0.63 -> 0.77 with them, ChemProt 0.38 -> 0.47)."""
    X = embedder.encode([ex.text for ex in examples])
    if relation:
        X = np.hstack([X, embedder.encode([view_text(ex.as_input(), "between") for ex in examples])])
    return X


def _fit(X: np.ndarray, y: np.ndarray, k: int, seed: int) -> tuple[TextOnly, float, np.ndarray, np.ndarray]:
    """The classifier on all labeled rows, and its 3-fold out-of-fold accuracy, recall and false rate per class
    (each shrunk toward the overall rate: TREC's classes are confused unevenly, banking77 has 6 rows a class)."""
    votes = np.zeros((len(y), 0), dtype=np.int64)

    def fit(rows: np.ndarray) -> TextOnly:
        return TextOnly(k, feature="x", Cs=(PSEUDO_C,), seed=seed).fit(votes[rows], y[rows], X[rows])

    guessed = np.full(len(y), -1)
    for train, held in make_folds(y, 3, seed):
        guessed[held] = fit(train).predict_proba(votes[held], X[held]).argmax(axis=1)
    scored = guessed >= 0
    accuracy = float(np.mean(guessed[scored] == y[scored])) if scored.any() else 0.0
    even = (1.0 - accuracy) / max(k - 1, 1)
    recall, false_rate = np.full(k, accuracy), np.full(k, even)
    for c in range(k):
        own, other = scored & (y == c), scored & (y != c)
        recall[c] = (np.sum(guessed[own] == c) + SHRINK_ROWS * accuracy) / (own.sum() + SHRINK_ROWS)
        false_rate[c] = (np.sum(guessed[other] == c) + SHRINK_ROWS * even) / (other.sum() + SHRINK_ROWS)
    return fit(np.arange(len(y))), accuracy, recall, false_rate
