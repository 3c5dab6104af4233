"""Dawid-Skene: EM over one confusion matrix per annotator, so reliable annotators outvote noisy ones.

Abstaining is modelled as one more response: most annotators vote for a single class, so *whether* one
fires is all the information it carries (ignoring abstentions makes such an annotator's confusion matrix
constant, and EM collapses to one class). Fitted on the votes of the rows it is given, which may be
unlabeled; where labels are given (y >= 0) they start the EM and stay clamped, which makes it
semi-supervised. EM starts from the (smoothed) majority vote; rows nobody votes on start at the prior.
A class no annotator votes for and no given label holds stays at probability 0: left free, EM makes it the class of
"everyone abstains" and hands it the rows few annotators fire on (a label with no dev row took a third of the demo).
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from engine.aggregators.base import BaseAggregator, Features, check_labels, check_votes, class_prior, onehot_votes
from engine.domain import ABSTAIN
from engine.metrics.score import vote_counts


def _responses(votes: np.ndarray, n_classes: int):
    """(n, m*(k+1)) sparse indicator of each annotator's response; response k means it abstained."""
    return onehot_votes(np.where(votes == ABSTAIN, n_classes, votes), n_classes + 1)


class DawidSkene(BaseAggregator):
    """confusion_[j, true, r] = P(annotator j responds r | class `true`); r = k is "abstains"."""

    def __init__(self, n_classes: int, max_iter: int = 100, tol: float = 1e-5, smoothing: float = 0.01):
        self.n_classes = n_classes
        self.max_iter = max_iter
        self.tol = tol
        self.smoothing = smoothing

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None) -> DawidSkene:
        v = check_votes(votes, self.n_classes)
        y = check_labels(y, self.n_classes, v.shape[0])
        n, m = v.shape
        k = self.n_classes
        onehot = _responses(v, k)
        counts = vote_counts(v, k).astype(np.float64)
        total = counts.sum(axis=1, keepdims=True)
        labeled = np.zeros(n, dtype=bool) if y is None else y >= 0
        seen = counts.sum(axis=0) > 0
        if y is not None and labeled.any():
            seen[np.unique(y[labeled])] = True
        self.classes_seen_ = seen if seen.any() else np.ones(k, dtype=bool)
        start_prior = class_prior(y, k) * self.classes_seen_
        start_prior /= start_prior.sum()
        post = np.where(total > 0, (counts + 0.01) / (total + 0.01 * k), start_prior) * self.classes_seen_
        post /= post.sum(axis=1, keepdims=True)
        if y is not None and labeled.any():
            post[labeled] = np.eye(k)[y[labeled]]
        self.n_iter_ = 0
        for it in range(1, self.max_iter + 1):
            self._m_step(onehot, post, m)
            new = self._posterior(onehot)
            new[labeled] = post[labeled]
            change = float(np.abs(new - post).max()) if n else 0.0
            post = new
            self.n_iter_ = it
            if change < self.tol:
                break
        self._m_step(onehot, post, m)  # parameters consistent with the final posterior
        self.n_annotators_ = m
        return self

    def _m_step(self, onehot, post: np.ndarray, m: int) -> None:
        k, s = self.n_classes, self.smoothing
        counts = np.asarray(onehot.T @ post).reshape(m, k + 1, k)  # [j, response, true]
        counts = counts.transpose(0, 2, 1)  # [j, true, response]
        self.confusion_ = (counts + s) / (counts.sum(axis=2, keepdims=True) + (k + 1) * s)
        self.prior_ = (post.sum(axis=0) + 1.0) / (post.shape[0] + k)

    def _posterior(self, onehot) -> np.ndarray:
        k = self.n_classes
        log_conf = np.log(self.confusion_).transpose(0, 2, 1).reshape(-1, k)  # row (j, response) -> per class
        scores = np.log(self.prior_)[None, :] + np.asarray(onehot @ log_conf)
        scores[:, ~self.classes_seen_] = -np.inf
        return np.exp(scores - logsumexp(scores, axis=1, keepdims=True))

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        """Posterior class probabilities (a row nobody votes on is explained by everyone abstaining)."""
        v = self._votes_for_predict(votes)
        return self._posterior(_responses(v, self.n_classes))
