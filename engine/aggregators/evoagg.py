"""EvoAgg: a logistic regression over [text features ; one-hot votes], fitted on dev labels only.

The classifier learns how far to trust each annotator per class and where the text itself says more
than the votes. Beside text, the one-hot vote block is scaled down by `vote_weight` (an L2 penalty 1/w² times
heavier on the votes' coefficients): the pool was chosen on these dev rows, where its votes are right more often
than anywhere else, and an LR fitted there trusts them too much (bench/vote_weight.py). C is chosen by stratified
cross-validation on dev (macro-F1), classes are balanced. `TextOnly` is the same model on one text feature matrix
alone (no votes), be it sentence embeddings or TF-IDF n-grams: a baseline the auto aggregator weighs against the
vote-based ones. `MultiLabelEvoAgg` fits one binary model per class.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import normalize
from threadpoolctl import threadpool_limits

from engine.aggregators.base import (
    BaseAggregator,
    Features,
    Matrix,
    check_label_sets,
    check_labels,
    check_votes,
    class_prior,
    make_folds,
    onehot_votes,
    select_feature,
)
from engine.metrics.score import macro_f1

# the vote block's scale beside a text block, chosen on rows that are neither dev nor test: the withheld gold labels
# of the unlabeled pool rows (bench/vote_weight.py, results in bench/results/vote_weight.md)
VOTE_WEIGHT = 0.25


class _Linear:
    """A fitted LR that always answers with all k columns (classes missing from training get 0)."""

    def __init__(self, F: Matrix, y: np.ndarray, C: float, n_classes: int, seed: int, max_iter: int,
                 class_weight: str | None = "balanced"):
        self.n_classes = n_classes
        present = np.unique(y)
        self.constant: np.ndarray | None = None
        if present.size < 2:  # nothing to separate: answer the (smoothed) prior
            self.constant = class_prior(y, n_classes)
            return
        self.model = LogisticRegression(C=C, class_weight=class_weight, max_iter=max_iter, random_state=seed)
        # sparse columns empty on the training rows (TF-IDF terms of other rows) get no weight under L2 but
        # cost lbfgs time per class: fit and predict on the others (50k-term vocabularies, 500 dev rows)
        self.columns = np.unique(F.indices) if sparse.issparse(F) and F.format == "csr" else None
        if self.columns is not None and F.shape[1] and not len(self.columns):
            # nothing on these rows to read (votes alone, and none fired on a fold's training rows): the prior
            self.constant = class_prior(y, n_classes)
            return
        # one BLAS thread: on small dev matrices, thread contention made lbfgs ~100x slower on a busy machine
        with warnings.catch_warnings(), threadpool_limits(limits=1):
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model.fit(self._used(F), y)

    def refit(self, F: Matrix, y: np.ndarray, C: float) -> _Linear:
        """The same model at another C, started from this one's solution (the regularisation path): the L2
        problem has one optimum, so this lands where a fresh fit would (to lbfgs tolerance) in fewer steps."""
        if self.constant is None:
            self.model.set_params(C=C, warm_start=True)
            with warnings.catch_warnings(), threadpool_limits(limits=1):
                warnings.simplefilter("ignore", ConvergenceWarning)
                self.model.fit(self._used(F), y)
        return self

    def _used(self, F: Matrix) -> Matrix:
        return F if self.columns is None else sparse.csr_matrix(F)[:, self.columns]

    def predict_proba(self, F: Matrix) -> np.ndarray:
        if self.constant is not None:
            return np.tile(self.constant, (F.shape[0], 1))
        out = np.zeros((F.shape[0], self.n_classes))
        if F.shape[0]:
            out[:, self.model.classes_] = self.model.predict_proba(self._used(F))
        return out


class _LinearAggregator(BaseAggregator):
    """Shared body of EvoAgg and TextOnly: design matrix, C by dev CV, one LR."""

    _use_votes = True

    def __init__(self, n_classes: int, feature: str | None = "embedding", Cs: Sequence[float] = (0.1, 1.0, 10.0, 100.0),
                 cv: int = 3, seed: int = 0, max_iter: int = 1000, vote_weight: float = VOTE_WEIGHT):
        self.n_classes = n_classes
        self.feature = feature
        self.Cs = Cs
        self.cv = cv
        self.seed = seed
        self.max_iter = max_iter
        self.vote_weight = vote_weight  # the one-hot votes' scale beside text (alone, C sets their scale)

    def _design(self, v: np.ndarray, Xf: Matrix | None) -> Matrix:
        blocks: list[Matrix] = []
        if Xf is not None:  # unit-norm rows: text weighs about as much as one vote at weight 1, C sets the rest
            Xf = sparse.csr_matrix(Xf, dtype=np.float64) if sparse.issparse(Xf) else np.asarray(Xf, dtype=np.float64)
            blocks.append(normalize(Xf) if Xf.shape[0] else Xf)
        if self._use_votes:
            onehot = onehot_votes(v, self.n_classes)
            blocks.append(onehot * self.vote_weight if blocks else onehot)
        if not blocks:
            raise ValueError(f"{type(self).__name__} has no input: pass X with feature {self.feature!r}")
        if len(blocks) == 1:
            return blocks[0]
        if sparse.issparse(blocks[0]):  # sparse text features (TF-IDF): stay sparse
            return sparse.hstack(blocks, format="csr")
        return np.hstack([blocks[0], blocks[1].toarray()])

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> _LinearAggregator:
        if y is None:
            raise ValueError(f"{type(self).__name__} is fitted on dev labels: y is required")
        v = check_votes(votes, self.n_classes)
        y = check_labels(y, self.n_classes, v.shape[0])
        Xf = select_feature(X, self.feature, v.shape[0])
        keep = np.flatnonzero(y >= 0)
        v, y = v[keep], y[keep]
        Xf = None if Xf is None else Xf[keep]
        self.uses_features_ = Xf is not None
        F = self._design(v, Xf)
        self.cv_scores_ = self._cv_scores(F, y)  # {} when there is no choice to make
        if self.cv_scores_:
            self.C_ = max(self.cv_scores_, key=self.cv_scores_.__getitem__)  # ties: the earlier C
        else:
            self.C_ = float(self.Cs[0]) if len(self.Cs) else 1.0
        self.model_ = _Linear(F, y, self.C_, self.n_classes, self.seed, self.max_iter)
        self.n_annotators_ = v.shape[1]
        return self

    def _cv_scores(self, F: Matrix, y: np.ndarray) -> dict[float, float]:
        """Dev CV macro-F1 of each C (empty when dev is too small to hold rows out)."""
        folds = make_folds(y, self.cv, self.seed)
        if not folds or len(self.Cs) < 2:
            return {}
        scores = {}
        for C in self.Cs:
            pred = np.zeros(y.shape[0], dtype=np.int64)
            for train, test in folds:
                model = _Linear(F[train], y[train], C, self.n_classes, self.seed, self.max_iter)
                pred[test] = model.predict_proba(F[test]).argmax(axis=1)
            scores[float(C)] = macro_f1(y, pred, self.n_classes)
        return scores

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        v = self._votes_for_predict(votes)
        Xf = select_feature(X, self.feature, v.shape[0]) if self.uses_features_ else None
        if self.uses_features_ and Xf is None:
            raise ValueError(f"{type(self).__name__} was fitted with feature {self.feature!r}: pass X")
        return self.model_.predict_proba(self._design(v, Xf))

    def oof_path(self, votes: np.ndarray, y: np.ndarray, X: Features, folds: list,
                 Cs: Sequence[float]) -> list[np.ndarray]:
        """(n, k) out-of-fold probabilities at each C of `Cs` (in that order), as `oof_proba` gives for
        `Cs=(C,)` one C at a time: per fold the design is built once and the fits climb C in ascending order,
        each warm-started from the last, so the higher Cs need fewer steps."""
        v = check_votes(votes, self.n_classes)
        y = np.asarray(y, dtype=np.int64)
        Xf = select_feature(X, self.feature, v.shape[0])
        F = self._design(v, Xf)
        out = {float(C): np.zeros((len(y), self.n_classes)) for C in Cs}
        for train, held in folds or [(np.arange(len(y)), np.arange(len(y)))]:
            F_train, F_held = F[train], F[held]
            model: _Linear | None = None
            for C in sorted(out):
                model = _Linear(F_train, y[train], C, self.n_classes, self.seed, self.max_iter) if model is None \
                    else model.refit(F_train, y[train], C)
                out[C][held] = model.predict_proba(F_held)
        return [out[float(C)] for C in Cs]


class EvoAgg(_LinearAggregator):
    """LR over [X[feature] ; one-hot votes]; feature=None (or X=None) means votes only."""


class TextOnly(_LinearAggregator):
    """LR over X[feature] alone (embeddings, TF-IDF, ...): what the text says, ignoring the annotators."""

    _use_votes = False


class MultiLabelEvoAgg(BaseAggregator):
    """Multi-label tasks: one balanced binary LR per class over [X ; one-hot votes]; Y is (n, k) 0/1.

    predict_proba returns (n, k) independent per-class probabilities (rows need not sum to 1).
    """

    def __init__(self, n_classes: int, feature: str | None = "embedding", C: float = 1.0, seed: int = 0,
                 max_iter: int = 1000):
        self.n_classes = n_classes
        self.feature = feature
        self.C = C
        self.seed = seed
        self.max_iter = max_iter

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> MultiLabelEvoAgg:
        if y is None:
            raise ValueError("MultiLabelEvoAgg needs a (n, k) 0/1 label matrix")
        v = check_votes(votes, self.n_classes)
        Y = check_label_sets(y, self.n_classes, v.shape[0])
        # weight 1: no multi-label data to choose a vote weight on (bench/vote_weight.py covers single-label sets)
        self.encoder_ = EvoAgg(self.n_classes, feature=self.feature, vote_weight=1.0)
        Xf = select_feature(X, self.feature, v.shape[0])
        self.uses_features_ = Xf is not None
        F = self.encoder_._design(v, Xf)
        self.models_ = [_Linear(F, Y[:, c], self.C, 2, self.seed, self.max_iter) for c in range(self.n_classes)]
        self.n_annotators_ = v.shape[1]
        return self

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        v = self._votes_for_predict(votes)
        Xf = select_feature(X, self.feature, v.shape[0]) if self.uses_features_ else None
        F = self.encoder_._design(v, Xf)
        return np.column_stack([m.predict_proba(F)[:, 1] for m in self.models_])


def predict_labels(proba: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """(n, k) 0/1 multi-label decision: every class whose probability reaches the threshold."""
    return (np.asarray(proba) >= threshold).astype(np.int64)
