"""How much better labels fitted on all of dev are than the out-of-fold models that estimated them.

Five-fold cross-validation judges models fitted on 80 % of dev, while the labels come from a model fitted on all of
it; on a small dev (banking77: 6 rows a class) that costs the estimate several points. A cheap model of the same
text (logistic regression on the sentence embeddings) is scored out of fold at two sizes, 2-fold (50 %) and 5-fold
(80 %), and its curve, taken as F1(n) = a - b / n, is carried to 100 %: the gain is a third of the step from 50 % to
80 %. Read off dev alone; never below zero.
"""
from __future__ import annotations

import numpy as np

from engine.aggregators.base import make_folds, oof_proba
from engine.aggregators.evoagg import TextOnly
from engine.metrics.score import macro_f1

REPEATS = 3


def learning_curve_gain(y: np.ndarray, embedding: np.ndarray, n_classes: int, seed: int = 0) -> float:
    """The macro-F1 a model fitted on all `y` rows would gain over the 5-fold out-of-fold figure (0 when the two
    sizes cannot be compared: too few rows for two folds)."""
    y = np.asarray(y, dtype=np.int64)
    if not make_folds(y, 2, seed) or not make_folds(y, 5, seed):
        return 0.0
    votes = np.zeros((len(y), 0), dtype=np.int64)

    def at(splits: int, repeat: int) -> float:
        proba = oof_proba(lambda: TextOnly(n_classes, feature="embedding", Cs=(1.0,), seed=seed), votes, y,
                          {"embedding": embedding}, make_folds(y, splits, seed + repeat))
        return macro_f1(y, proba.argmax(axis=1), n_classes)

    # a few seeded splits each: one 2-fold split moves the step by as much as the step itself
    step = np.mean([at(5, r) - at(2, r) for r in range(REPEATS)])
    return max(0.0, float(step) / 3)
