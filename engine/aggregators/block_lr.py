"""Logistic regression over a design given as column blocks (dense embeddings beside sparse TF-IDF).

The student reads MiniLM embeddings (dense, a few hundred columns) next to TF-IDF (sparse, thousands): stacked
into one sparse matrix for scikit-learn, the dense block's millions of stored entries make every L-BFGS step a
slow sparse product. Here each block keeps its own kind, so the dense block is one BLAS call (ChemProt's
student: 4,500 rows, 768 dense columns beside thousands of sparse ones, 10 classes).

The objective, the start (zeros) and the optimizer's settings are scikit-learn's `LogisticRegression` with
lbfgs (1.x): mean weighted log-loss plus `||W||^2 / (2 C sum(w))`, intercept unpenalised, multinomial over the
classes present, one sigmoid when two are, so the fitted model is the same one to the optimizer's tolerance
(tests/test_student.py holds it to that).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
from scipy import optimize, sparse
from scipy.special import expit, log_expit, logsumexp

Block: TypeAlias = Any  # a numpy array or a scipy sparse matrix (the type checker reads no types from scipy)


def _dot(blocks: Sequence[Block], coefs: Sequence[np.ndarray]) -> np.ndarray:
    total = np.zeros(())  # as sum() would, from nothing: 0 + x is x
    for b, c in zip(blocks, coefs, strict=True):
        total = total + np.asarray(b @ c)
    return total


class BlockLogisticRegression:
    """L2 logistic regression fitted with L-BFGS on column blocks; `predict_proba` answers `classes_`' columns."""

    def __init__(self, C: float = 1.0, max_iter: int = 100, tol: float = 1e-4):
        self.C = C
        self.max_iter = max_iter
        self.tol = tol

    def fit(self, blocks: Sequence[Block], y: np.ndarray, sample_weight: np.ndarray | None = None
            ) -> BlockLogisticRegression:
        if not blocks:
            raise ValueError("BlockLogisticRegression needs at least one block of columns")
        blocks = [sparse.csr_matrix(b, dtype=np.float64) if sparse.issparse(b) else np.asarray(b, np.float64)
                  for b in blocks]
        self.classes_, target = np.unique(np.asarray(y), return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError("logistic regression needs at least two classes")
        w = np.ones(len(target)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        widths = [b.shape[1] for b in blocks]
        k = 1 if self.classes_.size == 2 else self.classes_.size  # two classes: one sigmoid, as scikit-learn
        l2 = 1.0 / (self.C * w.sum())
        onehot = np.eye(k)[target] if k > 1 else None

        def unpack(theta: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
            W = theta[:-k].reshape(sum(widths), k)
            return np.split(W, np.cumsum(widths)[:-1]), theta[-k:]

        def loss_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
            coefs, bias = unpack(theta)
            Z = _dot(blocks, coefs) + bias
            if k == 1:
                z, sign = Z[:, 0], 2.0 * target - 1.0
                loss = -(w * log_expit(sign * z)).sum()
                G = (w * (expit(z) - target))[:, None]
            else:
                lse = logsumexp(Z, axis=1)
                loss = (w * (lse - Z[np.arange(len(target)), target])).sum()
                G = w[:, None] * (np.exp(Z - lse[:, None]) - onehot)
            G /= w.sum()
            W = theta[:-k]
            grads = [np.asarray(b.T @ G) for b in blocks]
            grad = np.concatenate([np.concatenate(grads).ravel() + l2 * W, G.sum(axis=0)])
            return loss / w.sum() + 0.5 * l2 * float(W @ W), grad

        result = optimize.minimize(loss_grad, np.zeros(sum(widths) * k + k), method="L-BFGS-B", jac=True,
                                   options={"maxiter": self.max_iter, "maxls": 50, "gtol": self.tol,
                                            "ftol": 64 * np.finfo(float).eps})
        self.coefs_, self.intercept_ = unpack(result.x)
        self.n_iter_ = int(result.nit)
        return self

    def decision(self, blocks: Sequence[Block]) -> np.ndarray:
        return _dot(blocks, self.coefs_) + self.intercept_

    def predict_proba(self, blocks: Sequence[Block]) -> np.ndarray:
        Z = self.decision(blocks)
        if Z.shape[1] == 1:
            p = expit(Z[:, 0])
            return np.column_stack([1.0 - p, p])
        return np.exp(Z - logsumexp(Z, axis=1)[:, None])
