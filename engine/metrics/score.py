"""Dev-split fitness: per-annotator scores, pool macro-F1 and the pairwise analytics the studio shows.

Pure numpy and deterministic. Votes are integer class ids with `ABSTAIN` (-1) for "no vote";
an abstaining *prediction* always counts as wrong, so a pool cannot look better by staying silent.
Gold is an (n,) class vector, or for a multi-label task an (n, k) 0/1 matrix of label sets: the
annotator and pool scores dispatch on its ndim, so the gate and the evolve loop need no other change.
"""
from __future__ import annotations

import numpy as np

from engine.domain import ABSTAIN, AnnotatorScore


def _as_votes(votes: np.ndarray) -> np.ndarray:
    v = np.asarray(votes, dtype=np.int64)
    if v.ndim == 1:
        v = v[:, None]
    if v.ndim != 2:
        raise ValueError(f"votes must be a (n, m) matrix, got shape {v.shape}")
    return v


def vote_counts(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(n, k) number of non-abstaining votes each row gives each class."""
    v = _as_votes(votes)
    if v.size and (v.max() >= n_classes or v.min() < ABSTAIN):
        raise ValueError(f"votes must lie in [-1, {n_classes - 1}]")
    return np.stack([(v == c).sum(axis=1) for c in range(n_classes)], axis=1).reshape(v.shape[0], n_classes)


def majority_vote(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(n,) most-voted class per row; ties go to the lowest class id; rows without votes ABSTAIN."""
    counts = vote_counts(votes, n_classes)
    out = counts.argmax(axis=1).astype(np.int64)
    out[counts.sum(axis=1) == 0] = ABSTAIN
    return out


def per_class_f1(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(k,) F1 of each class; ABSTAIN predictions are false negatives; undefined F1 (no support) is 0."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true {y_true.shape} and y_pred {y_pred.shape} differ in shape")
    def count(values: np.ndarray) -> np.ndarray:  # (k,) occurrences of each class id
        return np.bincount(values[(values >= 0) & (values < n_classes)], minlength=n_classes)

    tp = count(y_true[y_pred == y_true])
    denom = count(y_pred) + count(y_true)  # 2tp + fp + fn
    return np.where(denom > 0, 2.0 * tp / np.maximum(denom, 1), 0.0)


def judged_classes(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(k,) bool: the classes present in gold or predictions, the ones a macro-F1 of these rows averages over."""
    present = np.zeros(n_classes, dtype=bool)
    for arr in (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)):
        present[arr[(arr >= 0) & (arr < n_classes)]] = True
    return present


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int, classes: np.ndarray | None = None) -> float:
    """Mean F1 over the classes present in gold or predictions (0.0 when there are none), or over `classes` (a
    (k,) bool mask): two sets of rows compared on the same classes, e.g. fitness rows on the classes the audit
    rows can judge."""
    present = judged_classes(y_true, y_pred, n_classes) if classes is None else np.asarray(classes, dtype=bool)
    if not present.any():
        return 0.0
    return float(per_class_f1(y_true, y_pred, n_classes)[present].mean())


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Share of rows predicted correctly; an abstention is wrong; 0.0 for no rows."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if y_true.size == 0:
        return 0.0
    return float(np.mean((y_pred == y_true) & (y_pred != ABSTAIN)))


def _hits(v: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) bool: the vote is right. Multi-label gold (n, k): the voted class is in the row's label set."""
    if y.ndim == 2:
        if y.shape[0] != v.shape[0]:
            raise ValueError(f"votes {v.shape} and label matrix {y.shape} differ in rows")
        fired = v != ABSTAIN
        out = np.zeros(v.shape[0], dtype=bool)
        out[fired] = y[np.flatnonzero(fired), v[fired]] == 1
        return out
    y = y.ravel()
    if v.shape != y.shape:
        raise ValueError(f"votes {v.shape} and labels {y.shape} differ in shape")
    return (v != ABSTAIN) & (v == y)


def score_annotator(annotator_id: str, votes: np.ndarray, y: np.ndarray, faults: int = 0) -> AnnotatorScore:
    """Fitness of one annotator from its (n,) dev votes and the gold: (n,) labels or (n, k) 0/1 label sets."""
    v = np.asarray(votes, dtype=np.int64).ravel()
    y = np.asarray(y, dtype=np.int64)
    fired = v != ABSTAIN
    fires = int(fired.sum())
    correct = int(np.sum(_hits(v, y)))
    if fires:
        classes, counts = np.unique(v[fired], return_counts=True)
        label = int(classes[counts.argmax()])  # np.unique sorts, so ties go to the lowest id
    else:
        label = ABSTAIN
    return AnnotatorScore(
        annotator_id=annotator_id,
        fires=fires,
        coverage=fires / v.size if v.size else 0.0,
        precision=correct / fires if fires else 0.0,
        label=label,
        correct=correct,
        faults=int(faults),
    )


def pool_macro_f1(votes: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    """Dev macro-F1 of the pool (an empty pool abstains everywhere).

    (n,) gold: of the pool's majority vote. (n, k) gold: multi-label macro-F1, where a row is predicted
    class c when at least one annotator voted c.
    """
    y = np.asarray(y, dtype=np.int64)
    if y.ndim == 2:
        return multilabel_f1(y, vote_counts(votes, n_classes) > 0)[0]
    return macro_f1(y, majority_vote(votes, n_classes), n_classes)


def audit_and_fitness_f1(audit_votes: np.ndarray, audit_gold: np.ndarray, fitness_votes: np.ndarray,
                         fitness_gold: np.ndarray, n_classes: int) -> tuple[float, float, np.ndarray]:
    """The pool's majority-vote macro-F1 on the audit rows and on the fitness rows over the same classes, and the
    (k,) mask of those classes. Macro-F1 averages over the classes present: a hundred audit rows may hold no row
    of a small class the pool never gets right, and the fitness figure would then count a zero the audit figure
    leaves out, so the gap between them would not be selection alone. The classes are those the audit gold holds:
    a class the pool names on an audit row but no audit row holds could only score 0 there. Single-label gold."""
    audit_pred = majority_vote(audit_votes, n_classes)
    judged = class_counts(audit_gold, n_classes) > 0
    return (macro_f1(audit_gold, audit_pred, n_classes, classes=judged),
            macro_f1(fitness_gold, majority_vote(fitness_votes, n_classes), n_classes, classes=judged), judged)


def multilabel_f1(Y: np.ndarray, P: np.ndarray) -> tuple[float, float]:
    """(macro, micro) F1 of (n, k) 0/1 predictions P against gold Y.

    Macro averages the per-class binary F1 over the classes present in gold or predictions, as
    `macro_f1` does; both are 0.0 when nothing is present.
    """
    Y, P = np.asarray(Y).astype(bool), np.asarray(P).astype(bool)
    if Y.shape != P.shape:
        raise ValueError(f"gold {Y.shape} and predictions {P.shape} differ in shape")
    tp = (Y & P).sum(axis=0)
    denom = Y.sum(axis=0) + P.sum(axis=0)  # 2tp + fp + fn per class
    present = denom > 0
    if not present.any():
        return 0.0, 0.0
    macro = float(np.mean(2.0 * tp[present] / denom[present]))
    return macro, float(2.0 * tp.sum() / denom.sum())


def exact_match(Y: np.ndarray, P: np.ndarray) -> float:
    """Share of rows whose predicted label set equals the gold set; 0.0 for no rows."""
    Y, P = np.asarray(Y).astype(bool), np.asarray(P).astype(bool)
    return float((Y == P).all(axis=1).mean()) if Y.shape[0] else 0.0


def overlap_matrix(votes: np.ndarray) -> np.ndarray:
    """(m, m) share of rows on which both annotators fire; the diagonal is each one's coverage."""
    v = _as_votes(votes)
    fired = (v != ABSTAIN).astype(np.float64)
    return fired.T @ fired / v.shape[0] if v.shape[0] else np.zeros((v.shape[1], v.shape[1]))


def conflict_matrix(votes: np.ndarray) -> np.ndarray:
    """(m, m) share of rows on which both annotators fire but vote for different classes."""
    v = _as_votes(votes)
    n, m = v.shape
    if n == 0:
        return np.zeros((m, m))
    fired = (v != ABSTAIN).astype(np.float64)
    same = np.zeros((m, m))
    for c in np.unique(v[v != ABSTAIN]):
        onehot = (v == c).astype(np.float64)
        same += onehot.T @ onehot
    return (fired.T @ fired - same) / n


def coverage_per_class(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(k,) share of rows that receive at least one vote for each class: which classes the pool reaches."""
    counts = vote_counts(votes, n_classes)
    if counts.shape[0] == 0:
        return np.zeros(n_classes)
    return (counts > 0).mean(axis=0)


def disagreement(votes: np.ndarray) -> np.ndarray:
    """(n,) entropy in bits of each row's non-abstaining votes: 0 for unanimous or silent rows."""
    v = _as_votes(votes)
    out = np.zeros(v.shape[0])
    classes = np.unique(v[v != ABSTAIN])
    if classes.size == 0:
        return out
    counts = np.stack([(v == c).sum(axis=1) for c in classes], axis=1).astype(np.float64)
    total = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, counts / np.maximum(total, 1), 0.0)
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=1) + 0.0  # + 0.0 turns -0.0 into 0.0


def marginal_contributions(votes: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """(m,) pool macro-F1 minus the pool macro-F1 without each annotator (gold as in `pool_macro_f1`)."""
    v = _as_votes(votes)
    full = pool_macro_f1(v, y, n_classes)
    return np.array([full - pool_macro_f1(np.delete(v, j, axis=1), y, n_classes) for j in range(v.shape[1])])


def wilson_lower(correct: float, n: float, z: float = 1.0) -> float:
    """Lower Wilson bound of a precision: 5 of 5 is not 1.0 (it is 0.83 at z=1), 50 of 50 nearly is."""
    if n <= 0:
        return 0.0
    if z <= 0:
        return correct / n
    p = correct / n
    centre = p + z * z / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float((centre - spread) / (1 + z * z / n))


def class_counts(y: np.ndarray, n_classes: int) -> np.ndarray:
    """(k,) dev rows of each class ((n, k) label sets: rows whose set holds it); unlabeled rows (-1) count for none."""
    y = np.asarray(y, dtype=np.int64)
    if y.ndim == 2:
        return (y > 0).sum(axis=0).astype(np.int64)
    return np.bincount(y[y >= 0], minlength=n_classes)[:n_classes]


def class_shares(y: np.ndarray, n_classes: int) -> np.ndarray:
    """(k,) share of dev rows of each class ((n, k) label sets: share of rows whose set holds it)."""
    n_rows = np.asarray(y).shape[0]
    return class_counts(y, n_classes) / n_rows if n_rows else np.zeros(n_classes)


def chance_precision(votes: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    """The precision an annotator with these votes would get by firing on random rows: the mean share of dev
    held by the classes it votes (a rule like "words <= 54" that votes the biggest class scores about this).
    0.0 when it never fires."""
    v = np.asarray(votes, dtype=np.int64).ravel()
    fired = v[v != ABSTAIN]
    return float(class_shares(y, n_classes)[fired].mean()) if fired.size else 0.0


def lift(precision: float, chance: float) -> float:
    """How many times better than chance a precision is (inf when chance is 0)."""
    return precision / chance if chance > 0 else float("inf")


def voted_class_rows(votes: np.ndarray, y: np.ndarray, n_classes: int) -> int:
    """Dev rows of the biggest class an annotator votes (0 when it never fires): what the small-class rule reads, so a
    voter of a big class never has its fires asked as for a small one."""
    v = np.asarray(votes, dtype=np.int64).ravel()
    fired = np.unique(v[v != ABSTAIN])
    if not fired.size:
        return 0
    return int(class_counts(y, n_classes)[fired].max())


def fires_needed(min_fires: int, class_rows: int, small_class_fires: int) -> int:
    """Fires asked of an annotator whose (biggest voted) class holds `class_rows` of the rows it is judged on:
    `min_fires`, or for a class with fewer rows than that, as many fires as the class has rows but at least
    `small_class_fires` (0: off). Five fires cannot show a class dev holds three rows of: ChemProt's Cofactor word
    "cofactor" fires on 3 fitness rows, 2 of them Cofactor, and on 37 pool rows, 24 of them Cofactor (of 35; read
    ad hoc on seed 0)."""
    if small_class_fires <= 0 or class_rows <= 0:  # no dev row of its class: nothing to excuse fewer fires by
        return min_fires
    return int(min(min_fires, max(small_class_fires, class_rows)))
