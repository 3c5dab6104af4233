"""What every aggregator shares: the contract, vote encoding, feature selection and the dev folds.

Convention for text features `X` (used by every aggregator, in `fit` and `predict_proba` alike):
`X` is None, one feature matrix (dense ndarray or scipy sparse, one row per vote row), or a dict of
named matrices such as ``{"embedding": E, "tfidf": T}``. Vote-only aggregators ignore it. A
feature-using aggregator names the matrix it wants with its `feature` hyperparameter and picks it
from a dict; a bare matrix is used as given, whatever its name.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias, overload

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.utils.validation import check_array, check_is_fitted

from engine.domain import ABSTAIN

# a numpy array or a scipy sparse matrix; Any to the type checker, which reads no types from scipy here
Matrix: TypeAlias = Any
# a Matrix, {feature name: Matrix}, or None
Features: TypeAlias = Any
Folds = list[tuple[np.ndarray, np.ndarray]]


class Predictor(Protocol):
    """What gives soft labels once fitted: an aggregator, or an average of fitted ones."""

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray: ...


class Aggregator(Protocol):
    """The aggregator seam: scikit-learn style, votes first, text features optional."""

    n_classes: int

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> Aggregator: ...

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray: ...


def check_votes(votes: np.ndarray, n_classes: int, min_rows: int = 1) -> np.ndarray:
    """(n, m) int64 votes, each in [-1, k-1], validated by scikit-learn's `check_array`: a dense 2-D finite
    matrix of at least `min_rows` rows (fit needs one; predicting on none is fine). m may be 0: an empty pool,
    which text-only aggregators read. Raises ValueError (TypeError for sparse input) otherwise."""
    v = check_array(votes, dtype=np.int64, ensure_min_samples=min_rows, ensure_min_features=0, input_name="votes")
    if v.size and (v.min() < ABSTAIN or v.max() >= n_classes):
        raise ValueError(f"votes must lie in [-1, {n_classes - 1}], found [{v.min()}, {v.max()}]")
    return v


@overload
def check_labels(y: None, n_classes: int, n_rows: int) -> None: ...
@overload
def check_labels(y: np.ndarray, n_classes: int, n_rows: int) -> np.ndarray: ...
def check_labels(y: np.ndarray | None, n_classes: int, n_rows: int) -> np.ndarray | None:
    """(n,) int64 class ids in [-1, k-1] (-1: unlabeled), one per vote row; None stays None."""
    if y is None:
        return None
    labels = check_array(y, dtype=np.int64, ensure_2d=False, ensure_min_samples=0, input_name="y")
    if labels.ndim != 1 or labels.shape[0] != n_rows:
        raise ValueError(f"y must hold one class id per vote row ({n_rows}), got shape {labels.shape}")
    if labels.size and (labels.min() < ABSTAIN or labels.max() >= n_classes):
        raise ValueError(f"y must lie in [-1, {n_classes - 1}], found [{labels.min()}, {labels.max()}]")
    return labels


def check_label_sets(y: np.ndarray, n_classes: int, n_rows: int) -> np.ndarray:
    """(n, k) int64 0/1 label sets of a multi-label task, one row per vote row."""
    labels = check_array(y, dtype=np.int64, ensure_min_samples=0, input_name="y")
    if labels.shape != (n_rows, n_classes):
        raise ValueError(f"y must be a ({n_rows}, {n_classes}) 0/1 label-set matrix, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        raise ValueError(f"label sets must be 0/1, found [{labels.min()}, {labels.max()}]")
    return labels


def onehot_votes(votes: np.ndarray, n_classes: int) -> sparse.csr_matrix:
    """(n, m*k) sparse indicator: column j*k + c is 1 where annotator j voted class c."""
    n, m = votes.shape
    rows, cols = np.nonzero(votes != ABSTAIN)
    data = np.ones(rows.size)
    return sparse.csr_matrix((data, (rows, cols * n_classes + votes[rows, cols])), shape=(n, m * n_classes))


def feature_dict(X: Features) -> dict[str, Matrix]:
    """X as a dict of named matrices; a bare matrix is called "x"."""
    if X is None:
        return {}
    if isinstance(X, Mapping):
        return dict(X)
    return {"x": X}


def select_feature(X: Features, feature: str | None, n_rows: int) -> Matrix | None:
    """The one matrix a feature-using aggregator reads (None: votes only); checks its row count."""
    if X is None or feature is None:
        return None
    if isinstance(X, Mapping):
        if feature not in X:
            raise KeyError(f"X has no feature {feature!r}; it has {sorted(X)}")
        X = X[feature]
    if hasattr(X, "materialise"):  # rows computed on demand (large TF-IDF): this model reads them all
        X = X.materialise()
    if X.shape[0] != n_rows:
        raise ValueError(f"feature {feature!r} has {X.shape[0]} rows, votes have {n_rows}")
    return X


def take_rows(X: Features, idx: np.ndarray) -> Features:
    """The same rows of every feature matrix (works for dicts, dense and sparse)."""
    if X is None:
        return None
    if isinstance(X, Mapping):
        return {k: v[idx] for k, v in X.items()}
    return X[idx]


def class_prior(y: np.ndarray | None, n_classes: int, smoothing: float = 1.0) -> np.ndarray:
    """(k,) Laplace-smoothed class frequencies of the labeled rows; uniform without labels."""
    counts = np.zeros(n_classes)
    if y is not None:
        y = np.asarray(y, dtype=np.int64)
        counts = np.bincount(y[y >= 0], minlength=n_classes)[:n_classes].astype(np.float64)
    return (counts + smoothing) / (counts.sum() + n_classes * smoothing)


def make_folds(y: np.ndarray, n_splits: int = 5, seed: int = 0) -> Folds:
    """Seeded stratified folds (plain k-fold when no class is big enough); [] when too few rows."""
    y = np.asarray(y, dtype=np.int64)
    n_splits = min(n_splits, y.shape[0])
    if n_splits < 2:
        return []
    splitter: Any
    if np.bincount(y).max() >= n_splits:
        splitter = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    else:
        splitter = KFold(n_splits=n_splits, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "least populated class has only 1 member"
        return [(tr, te) for tr, te in splitter.split(np.zeros(y.shape[0]), y)]


def oof_proba(make: Callable[[], Aggregator], votes: np.ndarray, y: np.ndarray, X: Features,
              folds: Folds) -> np.ndarray:
    """(n, k) out-of-fold probabilities: each row predicted by a model that never saw its label."""
    votes = np.asarray(votes)
    y = np.asarray(y, dtype=np.int64)
    if not folds:  # too few rows to hold any out: in-sample is all there is
        return make().fit(votes, y, X).predict_proba(votes, X)
    out: np.ndarray | None = None
    for train, test in folds:
        model = make().fit(votes[train], y[train], take_rows(X, train))
        proba = model.predict_proba(votes[test], take_rows(X, test))
        if out is None:
            out = np.zeros((votes.shape[0], proba.shape[1]))
        out[test] = proba
    assert out is not None
    return out


def softmax(scores: np.ndarray) -> np.ndarray:
    z = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class BaseAggregator(BaseEstimator):
    """scikit-learn estimator plumbing: params from `__init__`, learned attributes end with `_`."""

    n_classes: int

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        raise NotImplementedError

    def predict(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        """(n,) most probable class (ties go to the lowest class id)."""
        return self.predict_proba(votes, X).argmax(axis=1)

    def oof_predict_proba(self, votes: np.ndarray, y: np.ndarray, X: Features = None,
                          folds: Folds | None = None, n_splits: int = 5) -> np.ndarray:
        """Honest dev probabilities: out-of-fold fits of a fresh copy; `self` is left untouched."""
        if folds is None:
            folds = make_folds(y, n_splits, getattr(self, "seed", 0))
        return oof_proba(lambda: clone(self), votes, y, X, folds)

    def _votes_for_predict(self, votes: np.ndarray) -> np.ndarray:
        """Checked votes for predicting: NotFittedError before `fit`, the fitted annotator count after."""
        check_is_fitted(self, "n_annotators_")
        v = check_votes(votes, self.n_classes, min_rows=0)
        if v.shape[1] != self.n_annotators_:
            raise ValueError(f"fitted on {self.n_annotators_} annotators, got votes from {v.shape[1]}")
        return v
