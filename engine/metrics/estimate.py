"""Honest figures: macro-F1 measured on rows that neither fitted nor chose what they judge, with an interval.

`estimate_macro_f1` turns (gold, predicted) pairs of such rows into an `Estimate`: the macro-F1 over the classes the
rows hold and a `level` interval. Each class's F1 is 2tp / (2tp + fp + fn); its uncertainty is drawn as a Beta over
tp "hits" and (fp + fn) / 2 "misses" (Jeffreys' half counts), so a class judged on 3 rows carries a wide spread and a
perfect score on 99 rows still has a lower bound below 1 (a plain bootstrap of a perfect score collapses to [1, 1]).
A class with fewer than `THIN_CLASS_ROWS` rows is judged only in part: its own figure weighs n / (n + THIN_CLASS_ROWS),
the rest is the thin classes' pooled figure (row-weighted: rare classes are seldom as good as the common ones, so
shrinking toward all classes would flatter the labels), and a class with no judged row at all counts as that pooled
figure, so the point estimate never silently drops it. Such classes are named.
`estimate_by_difference` is the figure of what can be judged on a few rows only (what reads the pool: its audit
rows), sharpened by a model judged on every row.
`paired_wins` is the paired comparison a chooser needs: how often one set of predictions beats another on the same
resampled rows. Pure numpy, seeded, deterministic.
"""
from __future__ import annotations

import numpy as np

from engine.domain import AUDIT, Estimate
from engine.metrics.score import per_class_f1

THIN_CLASS_ROWS = 5  # fewer judged rows than this: one row moves the class's F1 by 0.2 or more
LEVEL = 0.9
DRAWS = 1000
# the counts' weight in the Beta: below 1 widens it for what the counts do not show, the new rows' own sampling noise
# (a test split is a sample too) and the tie between classes (one row's error is one class's miss and another's false
# alarm). At 1.0, simulated rows (500 or 100 of them, 2-10 classes) held the figure of 1,000 new rows in 78-89 % of
# draws of a 90 % interval; at 0.75, in 87-93 %
SHARPNESS = 0.75


def _class_f1(y: np.ndarray, pred: np.ndarray, n_classes: int, judged: np.ndarray) -> np.ndarray:
    return per_class_f1(y, pred, n_classes)[judged]


def estimate_macro_f1(y: np.ndarray, pred: np.ndarray, n_classes: int, judged_on: str, seed: int = 0,
                      draws: int = DRAWS, level: float = LEVEL) -> Estimate | None:
    """The estimate and `level` interval of the macro-F1 these predictions would reach on new rows; None
    without a row to judge on. `y`, `pred`: (n,) class ids of the judging rows (pred may hold ABSTAIN)."""
    y = np.asarray(y, dtype=np.int64)
    pred = np.asarray(pred, dtype=np.int64)
    if len(y) == 0:
        return None
    counts = np.bincount(y, minlength=n_classes)[:n_classes]
    present = counts > 0
    thin = tuple(int(c) for c in np.flatnonzero(present & (counts < THIN_CLASS_ROWS)))
    unjudged = tuple(int(c) for c in np.flatnonzero(~present))
    hits = np.bincount(y[pred == y], minlength=n_classes)[:n_classes].astype(float)
    misses = (counts - hits + np.bincount(pred[(pred >= 0) & (pred != y)], minlength=n_classes)[:n_classes]) / 2
    observed = per_class_f1(y, pred, n_classes)[present]
    rows = counts[present]
    own = own_weight(rows)  # a thin class counts partly as the thin classes together: its own figure is mostly chance
    thin_mask = own < 1.0
    # what a rare class scores is best told by the rare classes pooled (row-weighted): they are seldom as good as the
    # common ones, so shrinking them toward the others' mean would flatter the labels (SemEval, ChemProt)
    prior_of = thin_mask if thin_mask.any() else np.ones_like(thin_mask)
    weights = rows[prior_of] / rows[prior_of].sum()
    point_per_class = own * observed + (1 - own) * (weights @ observed[prior_of])
    point = float(np.r_[point_per_class, np.full(len(unjudged), weights @ observed[prior_of])].mean())
    rng = np.random.default_rng(seed)
    a, b = SHARPNESS * hits[present] + 0.5, SHARPNESS * misses[present] + 0.5
    # each class's F1 drawn from its Beta, around the observed figure (the Beta's own mean leans toward 1/2 on a
    # handful of rows); the spread is read off these draws unshrunk: shrinking narrows it only as far as rare classes
    # are alike, which nobody checked
    f1 = np.clip(observed + rng.beta(a, b, size=(draws, len(a))) - a / (a + b), 0.0, 1.0)
    if unjudged:  # a class with no row at all: rarer still, it scores as the thin classes together
        f1 = np.concatenate([f1, np.repeat((f1[:, prior_of] @ weights)[:, None], len(unjudged), axis=1)], axis=1)
    raw = f1.mean(axis=1)
    center = float(np.r_[observed, np.full(len(unjudged), weights @ observed[prior_of])].mean())
    tail = (1 - level) / 2
    low, high = np.clip(point + np.quantile(raw - center, [tail, 1 - tail]), 0.0, 1.0)
    return Estimate(round(point, 4), round(float(min(low, point)), 4), round(float(max(high, point)), 4),
                    int(len(y)), judged_on, thin, unjudged, level)


def own_weight(rows: np.ndarray) -> np.ndarray:
    """How far a class's own figure counts, by its judged rows: fully from THIN_CLASS_ROWS on, else n / (n + that)
    (shrinkage toward the other classes: two rows say little of a class's F1)."""
    rows = np.asarray(rows, dtype=float)
    return np.where(rows >= THIN_CLASS_ROWS, 1.0, rows / (rows + THIN_CLASS_ROWS))


def paired_wins(y: np.ndarray, a: np.ndarray, b: np.ndarray, n_classes: int, seed: int = 0,
                draws: int = 200) -> float:
    """The share of bootstrap draws of these rows (the same draw for both) in which predictions `a` score a
    strictly higher macro-F1 than `b`, over the classes the rows hold."""
    y, a, b = (np.asarray(arr, dtype=np.int64) for arr in (y, a, b))
    if len(y) == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    present = np.bincount(y, minlength=n_classes)[:n_classes] > 0
    wins = 0
    for _ in range(draws):
        rows = rng.integers(0, len(y), len(y))
        wins += _class_f1(y[rows], a[rows], n_classes, present).mean() > \
            _class_f1(y[rows], b[rows], n_classes, present).mean() + 1e-12
    return wins / draws


def estimate_by_difference(y: np.ndarray, pred: np.ndarray, reference: np.ndarray, judged: np.ndarray,
                           n_classes: int, seed: int = 0, draws: int = DRAWS, level: float = LEVEL) -> Estimate | None:
    """The estimate of predictions that can be judged only on the `judged` rows (what reads the pool: audit rows),
    sharpened by a `reference` judged on every row (a text-only model's out-of-fold predictions): the reference's
    macro-F1 on all rows plus the predictions' lead over it on the judged rows. The two err on many of the same
    rows, so the paired lead is surer than either figure on the judged rows alone, and all rows carry the level.
    `pred` is read on the judged rows only."""
    y, pred, reference = (np.asarray(a, dtype=np.int64) for a in (y, pred, reference))
    at = np.flatnonzero(judged)
    base = estimate_macro_f1(y, reference, n_classes, "dev", seed, draws, level)
    if base is None or not len(at):
        return None
    present = np.bincount(y[at], minlength=n_classes)[:n_classes] > 0

    own = own_weight(np.bincount(y[at], minlength=n_classes)[:n_classes][present])  # a thin class's lead is chance

    def lead(rows: np.ndarray) -> float:
        gap = _class_f1(y[rows], pred[rows], n_classes, present) - _class_f1(y[rows], reference[rows], n_classes,
                                                                             present)
        return float((own * gap).mean())

    rng = np.random.default_rng(seed + 1)
    by_class = [at[y[at] == c] for c in range(n_classes) if present[c]]
    leads = np.array([lead(np.concatenate([members[rng.integers(0, len(members), len(members))]
                                           for members in by_class])) for _ in range(draws // 2)])
    # the reference's spread from its Beta draws (as `estimate_macro_f1` gives it), the lead's from the paired
    # bootstrap, widened by SHARPNESS as the Beta counts are
    z = float(np.sqrt(2) * _erfinv(level))
    base_sd = (base.high - base.low) / (2 * z)
    spread = z * float(np.sqrt(base_sd ** 2 + leads.var() / SHARPNESS))
    point = float(np.clip(base.macro_f1 + lead(at), 0.0, 1.0))
    thin = tuple(int(c) for c in np.flatnonzero(present & (np.bincount(y[at], minlength=n_classes)[:n_classes]
                                                           < THIN_CLASS_ROWS)))
    return Estimate(round(point, 4), round(max(0.0, point - spread), 4), round(min(1.0, point + spread), 4),
                    int(len(at)), AUDIT, thin, base.unjudged, level)


def _erfinv(level: float) -> float:
    """erfinv(level) by bisection: the two-sided normal quantile is sqrt(2) * erfinv(level)."""
    from math import erf

    low, high = 0.0, 6.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if erf(mid) < level else (low, mid)
    return (low + high) / 2
