"""Vote-counting aggregators: plain majority vote and accuracy-weighted majority vote."""
from __future__ import annotations

import numpy as np

from engine.aggregators.base import (
    BaseAggregator,
    Features,
    check_labels,
    check_votes,
    class_prior,
    onehot_votes,
    softmax,
)
from engine.domain import ABSTAIN
from engine.metrics.score import vote_counts


class MajorityVote(BaseAggregator):
    """Probabilities are smoothed vote shares; rows nobody votes on get the dev class prior."""

    def __init__(self, n_classes: int, smoothing: float = 0.1):
        self.n_classes = n_classes
        self.smoothing = smoothing

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> MajorityVote:
        v = check_votes(votes, self.n_classes)
        self.n_annotators_ = v.shape[1]
        self.prior_ = class_prior(check_labels(y, self.n_classes, v.shape[0]), self.n_classes)
        return self

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        counts = vote_counts(self._votes_for_predict(votes), self.n_classes).astype(np.float64)
        total = counts.sum(axis=1, keepdims=True)
        proba = (counts + self.smoothing) / (total + self.n_classes * self.smoothing)
        proba[total[:, 0] == 0] = self.prior_
        return proba


class WeightedMajorityVote(BaseAggregator):
    """Each vote counts with its annotator's log-odds of dev accuracy (the one-coin model's weight).

    accuracy_j = (correct_j + s * pooled) / (fires_j + s), shrunk towards the pool's overall dev precision,
    so an annotator that rarely fires on dev gets about the typical weight rather than an extreme one;
    weight_j = max(0, log((k-1) acc_j / (1 - acc_j))): no better than chance weighs 0. The probabilities
    are the softmax of the weighted vote counts, i.e. the one-coin posterior under a uniform prior.
    """

    def __init__(self, n_classes: int, smoothing: float = 2.0):
        self.n_classes = n_classes
        self.smoothing = smoothing

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> WeightedMajorityVote:
        if y is None:
            raise ValueError("WeightedMajorityVote needs dev labels y to weigh annotators")
        v = check_votes(votes, self.n_classes)
        y = check_labels(y, self.n_classes, v.shape[0])
        labeled = v[y >= 0]
        gold = y[y >= 0][:, None]
        fired = labeled != ABSTAIN
        fires = fired.sum(axis=0)
        correct = (fired & (labeled == gold)).sum(axis=0)
        k, s = self.n_classes, self.smoothing
        pooled = (correct.sum() + 1.0) / (fires.sum() + k)  # chance-smoothed precision of all votes together
        acc = np.minimum((correct + s * pooled) / (fires + s), 1.0 - 1e-6)
        self.accuracy_ = acc
        self.weights_ = np.maximum(0.0, np.log((k - 1) * acc / (1.0 - acc))) if k > 1 else np.zeros(v.shape[1])
        self.prior_ = class_prior(y, self.n_classes)
        self.n_annotators_ = v.shape[1]
        return self

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        v = self._votes_for_predict(votes)
        k = self.n_classes
        # (m*k, k): column (j, c) of the one-hot votes adds weight_j to class c
        weight_map = np.tile(np.eye(k), (v.shape[1], 1)) * np.repeat(self.weights_, k)[:, None]
        per_class = np.asarray(onehot_votes(v, k) @ weight_map)
        proba = softmax(per_class)
        proba[per_class.sum(axis=1) == 0] = self.prior_  # nobody with weight voted
        return proba
