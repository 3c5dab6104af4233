"""The student stage: a text classifier trained on a teacher's labels over the unlabeled rows plus dev.

The labels of the unlabeled rows are what users take away and train on, so the two-stage pipeline of
WRENCH and Snorkel belongs in the product: any aggregator (the *teacher*: pool votes, text or both) labels
the unlabeled pool rows; a logistic regression on text features alone (the *student*) learns from those
thousands of rows, each weighted by the teacher's confidence, and from the dev rows with their gold labels.
With far more rows than dev it generalises better than its teacher, in a view the teacher may not read.

`prior_bias_`: per-class log-offsets that would bring the shares of the classes the student names on its unlabeled
rows to dev's shares; `match_prior=True` predicts with them (auto weighs both ways and keeps the shifted one only
when it scores clearly higher: `PRIOR_MIN_GAIN` in auto.py).

`fit(votes, y, X, unlabeled_votes=..., unlabeled_X=...)`: dev rows first (labeled), then the unlabeled ones.
The student predicts from text alone, so `predict_proba` ignores the votes (they are only checked), unless
`vote_weight` > 0: then the pool's one-hot votes are one more block of its design (`student+votes<...>` in auto's
names). Such a student learns how far to trust each annotator mostly from the unlabeled rows, where the votes were
not selected to be right (the pool was chosen on dev), against its teacher's labels there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import sparse
from sklearn.preprocessing import normalize
from threadpoolctl import threadpool_limits

from engine.aggregators.base import (
    Aggregator,
    BaseAggregator,
    Features,
    Predictor,
    check_votes,
    class_prior,
    onehot_votes,
    select_feature,
    take_rows,
)
from engine.aggregators.block_lr import Block, BlockLogisticRegression
from engine.domain import ABSTAIN

DEV_WEIGHT = 3.0  # a gold dev label counts as much as this many fully confident pseudo-labels
MAX_UNLABELED = 4000  # the student learns from a seeded sample of this many unlabeled rows at most...
# ...or of this many a class, when that is more (`student_sample_size`): 4,000 rows are 52 a class on banking77's 77.
# At 100 a class (7,700 rows) its text student rose by 0.005, 0.005 and 0.000 (seeds 0-2) on 1,500 held pool rows
# against their withheld gold, while 8,000 rows moved ChemProt's (10 classes, so still 4,000 here) by -0.003..+0.002
# (ad hoc, a scratch script; bench/quality.py measured what shipped)
ROWS_PER_CLASS = 100
# ...and never more than this many, however many classes: a bound on the student's fit time (each fold of each teacher
# fits one) and on the rows the corpus labeler embeds for it; not tuned (banking77, the most classes measured, is under)
MAX_STUDENT_ROWS = 12_000
# the one-hot votes' scale beside the text views of a student that reads them (the text blocks weigh as one unit-norm
# row): on the withheld gold labels of pool rows (six datasets, seeds 0-2, a text teacher, ad hoc before it shipped)
# 0.25 led the text student on 13 of 18 runs, 1.0 lost on banking77 and SemEval (the 50 annotators' 3,850 columns
# then outweigh the text)
STUDENT_VOTE_WEIGHT = 0.25


def reads_text(aggregator: object) -> bool:
    """Whether a fitted aggregator reads text features: an average of several when any of them does (auto's
    teachers), a linear model when it has a feature (EvoAgg, TextOnly); vote-only models (majority vote, weighted,
    Dawid-Skene, EvoAgg over the votes alone) read none."""
    members = getattr(aggregator, "members", None)
    if members is not None:
        return any(reads_text(m) for m in members)
    return getattr(aggregator, "feature", None) is not None


def student_sample_size(n_classes: int) -> int:
    """How many unlabeled rows a student of `n_classes` classes learns from at most: MAX_UNLABELED, or
    ROWS_PER_CLASS a class when that is more (many small classes need more rows than a few large ones), up to
    MAX_STUDENT_ROWS."""
    return min(max(MAX_UNLABELED, ROWS_PER_CLASS * n_classes), MAX_STUDENT_ROWS)


def unlabeled_sample(n: int, seed: int, limit: int) -> np.ndarray:
    """Sorted positions of a seeded sample of at most `limit` of `n` unlabeled rows (all of them when fewer).
    The caller may pass only these rows: the sample of a sample that small is all of it."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))


MAX_SHIFT_ROWS = 2000  # unlabeled rows outside the student's sample that its class-share offsets are fitted on


def shift_sample(n: int, seed: int, taken: np.ndarray, limit: int = MAX_SHIFT_ROWS) -> np.ndarray:
    """Sorted positions of up to `limit` of `n` unlabeled rows outside `taken` (the student's sample; empty when
    that holds them all): rows the student did not learn from, where its offsets do not overshoot."""
    rest = np.setdiff1d(np.arange(n), taken)
    if len(rest) <= limit:
        return rest
    return np.sort(np.random.default_rng(seed + 1).choice(rest, limit, replace=False))


def student_rows(n: int, seed: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Of `n` unlabeled rows, the student's seeded sample and the rows its offsets are fitted on (`shift_sample`;
    empty when the sample holds them all)."""
    rows = unlabeled_sample(n, seed, limit)
    return rows, shift_sample(n, seed, rows)


def auto_unlabeled_sample(n: int, seed: int, n_classes: int) -> np.ndarray:
    """The unlabeled rows worth handing to `auto` on a task of `n_classes`: enough for the student's sample
    (`student_sample_size`) and for the rows its class-share offsets are fitted on (`shift_sample`)."""
    return unlabeled_sample(n, seed, student_sample_size(n_classes) + MAX_SHIFT_ROWS)


def student_design(X: Features, views: Sequence[str], n_rows: int, votes: np.ndarray | None = None,
                   n_classes: int = 0, vote_weight: float = 0.0) -> list[Block]:
    """The student's design as column blocks, one per view: unit-norm rows, each block scaled by
    1/sqrt(#views) so that together they weigh as one; dense views stay dense (see block_lr). With `vote_weight`
    > 0, the one-hot `votes` (over `n_classes`) times it are the last block."""
    blocks: list[Block] = []
    for view in views:
        block = select_feature(X, view, n_rows)
        if block is None:
            raise ValueError(f"the student reads text view {view!r}: pass X with it")
        block = sparse.csr_matrix(block, dtype=np.float64) if sparse.issparse(block) else \
            np.asarray(block, dtype=np.float64)
        blocks.append(normalize(block) if block.shape[0] else block)
    if len(blocks) > 1:
        blocks = [b / np.sqrt(len(blocks)) for b in blocks]
    if vote_weight > 0:
        if votes is None or votes.shape[0] != n_rows:
            raise ValueError(f"a student that reads the votes needs {n_rows} rows of them")
        blocks.append(onehot_votes(votes, n_classes) * vote_weight)
    return blocks


# the student keeps the most frequent sparse columns: lbfgs time grows with columns x classes, and a column seen in
# one or two of 4,500 rows teaches little (10K rather than 20K: the same student dev out-of-fold macro-F1 on ChemProt
# and TREC, seed 0)
MAX_COLUMNS = 10_000


def frequent_columns(blocks: Sequence[Block], limit: int = MAX_COLUMNS) -> list[np.ndarray | None] | None:
    """Per block, the sorted columns kept (None: all): dense blocks whole, then the sparse columns with the most
    nonzero rows (ties: the earlier column) up to `limit` columns in all. None when nothing is dropped."""
    if sum(b.shape[1] for b in blocks) <= limit or not any(sparse.issparse(b) for b in blocks):
        return None  # dense views (embeddings) are kept whole
    room = limit - sum(b.shape[1] for b in blocks if not sparse.issparse(b))
    sparse_blocks = [sparse.csr_matrix(b) for b in blocks if sparse.issparse(b)]
    df = np.concatenate([np.bincount(b.indices, minlength=b.shape[1]) for b in sparse_blocks])
    chosen = np.sort(np.argsort(-df, kind="stable")[:max(room, 0)])
    out: list[np.ndarray | None] = []
    offset = 0
    for b in blocks:
        if not sparse.issparse(b):
            out.append(None)
            continue
        mine = chosen[(chosen >= offset) & (chosen < offset + b.shape[1])] - offset
        out.append(mine)
        offset += b.shape[1]
    return out


def keep_columns(blocks: Sequence[Block], columns: list[np.ndarray | None] | None) -> list[Block]:
    if columns is None:
        return list(blocks)
    return [b if cols is None else sparse.csr_matrix(b)[:, cols] for b, cols in zip(blocks, columns, strict=True)]


def fit_student(F_dev: Sequence[Block], y_dev: np.ndarray, F_unl: Sequence[Block], teacher_proba: np.ndarray,
                n_classes: int, C: float, max_iter: int = 300, informed: np.ndarray | None = None
                ) -> BlockLogisticRegression | np.ndarray:
    """An LR on dev (gold, weight DEV_WEIGHT) plus the unlabeled rows (the teacher's argmax, weighted by how
    far its probability stands above chance). Rows the teacher knows nothing about teach nothing: those where
    `informed` (bool per unlabeled row, None: all) is False, e.g. rows no annotator votes on for a teacher that
    reads only the votes (it answers dev's class prior there, which would teach "no vote: the largest class").
    A constant prior when only one class is present. F_dev and F_unl (column blocks) must already be restricted
    to the columns the student reads (see `frequent_columns`)."""
    chance = 1.0 / n_classes
    pseudo = teacher_proba.argmax(axis=1).astype(np.int64)
    weight_unl = np.clip((teacher_proba.max(axis=1, initial=0.0) - chance) / (1.0 - chance), 0.0, 1.0)
    if informed is not None:
        weight_unl = np.where(informed, weight_unl, 0.0)
    y = np.concatenate([y_dev, pseudo]).astype(np.int64)
    w = np.concatenate([np.full(len(y_dev), DEV_WEIGHT), weight_unl])
    if np.unique(y).size < 2:
        return class_prior(y, n_classes)
    teaching = np.flatnonzero(w > 0)
    F = [(sparse.vstack([d, u], format="csr") if sparse.issparse(d) else np.vstack([d, u]))[teaching]
         for d, u in zip(F_dev, F_unl, strict=True)]
    y, w = y[teaching], w[teaching]
    # balanced over the pseudo-labeled set: rare classes (what macro-F1 is won on) keep their voice
    counts = np.bincount(y, weights=w, minlength=n_classes)
    present = counts > 0
    scale = np.where(present, w.sum() / (present.sum() * np.maximum(counts, 1e-12)), 0.0)
    with threadpool_limits(limits=1):  # small products: BLAS threads only contend
        return BlockLogisticRegression(C=C, max_iter=max_iter).fit(F, y, sample_weight=w * scale[y])


def prior_bias(proba: np.ndarray, target: np.ndarray, iters: int = 50) -> np.ndarray:
    """(k,) log-offsets that bring the shares of the classes `proba` picks (argmax over the unlabeled rows) to
    `target`: a student trained on a teacher that rarely names a small class names it more rarely still (SemEval's
    Message-Topic: 2 dev rows, 0.4 % of its labels, about 3 % of the data). Damped steps, since argmax shares
    move in jumps."""
    if not len(proba):
        return np.zeros(len(target))
    logp = np.log(np.clip(proba, 1e-12, None))
    bias = np.zeros(len(target))
    for _ in range(iters):
        shares = (np.bincount((logp + bias).argmax(axis=1), minlength=len(target)) + 1.0) / (len(proba) + len(target))
        bias += 0.5 * np.log(target / shares)
    return bias - bias.mean()


def shifted(proba: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Probabilities times exp(bias) per class, renormalised."""
    out = proba * np.exp(bias)[None, :]
    total = out.sum(axis=1, keepdims=True)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def _n_rows(X: Features) -> int:
    """Row count of a feature matrix or of the first matrix of a dict of them."""
    first = next(iter(X.values())) if isinstance(X, dict) else X
    return first.shape[0]


def student_proba(model: BlockLogisticRegression | np.ndarray, F: Sequence[Block], n_classes: int) -> np.ndarray:
    n = F[0].shape[0]
    if isinstance(model, np.ndarray):
        return np.tile(model, (n, 1))
    out = np.zeros((n, n_classes))
    if n:
        out[:, model.classes_] = model.predict_proba(F)
    return out


class StudentAggregator(BaseAggregator):
    """A teacher aggregator labels the unlabeled rows; an LR over text `views` learns from them and from dev.

    `teacher`: a factory of fresh teacher aggregators; `teacher_name` says what it is (and whether it reads
    the pool's votes). Without unlabeled rows the student is just the LR on dev.
    """

    def __init__(self, n_classes: int, teacher: Callable[[], Aggregator], teacher_name: str = "",
                 views: Sequence[str] = ("tfidf",), C: float = 10.0, seed: int = 0,
                 max_unlabeled: int | None = None, max_columns: int = MAX_COLUMNS, match_prior: bool = False,
                 vote_weight: float = 0.0):
        self.n_classes = n_classes
        self.teacher = teacher
        self.teacher_name = teacher_name
        self.views = tuple(views)
        self.C = C
        self.seed = seed
        self.max_unlabeled = max_unlabeled  # None: `student_sample_size(n_classes)`
        self.max_columns = max_columns
        self.match_prior = match_prior  # predict with the class shares pulled toward dev's (`prior_bias`)
        self.vote_weight = vote_weight  # > 0: the one-hot votes are a block of the design, at this scale

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None,
            unlabeled_votes: np.ndarray | None = None, unlabeled_X: Features = None) -> StudentAggregator:
        if y is None:
            raise ValueError("the student's teacher is fitted on dev labels: y is required")
        v = check_votes(votes, self.n_classes)
        y = np.asarray(y, dtype=np.int64)
        teacher = self.teacher().fit(v, y, X)
        return self.fit_from_teacher(teacher, v, y, X, unlabeled_votes, unlabeled_X)

    def fit_from_teacher(self, teacher: Predictor, votes: np.ndarray, y: np.ndarray, X: Features,
                         unlabeled_votes: np.ndarray | None, unlabeled_X: Features,
                         shift_X: Features = None) -> StudentAggregator:
        """Fit the student from an already fitted teacher (auto reuses its fold models this way). `shift_X`: text
        of unlabeled rows it does not learn from, to fit `prior_bias_` on (default: `shift_sample` of the
        unlabeled rows when they outnumber the student's sample, else the sample itself)."""
        keep = np.flatnonzero(y >= 0)
        F_dev = [b[keep] for b in self._design(X, votes, votes.shape[0])]
        if unlabeled_votes is not None and len(unlabeled_votes):
            uv = check_votes(unlabeled_votes, self.n_classes)
            rows, shift = student_rows(uv.shape[0], self.seed, self._sample_size())
            sampled = take_rows(unlabeled_X, rows)  # before the design (row-wise): not all 100K rows per fit
            F_unl = self._design(sampled, uv[rows], len(rows))
            P = teacher.predict_proba(uv[rows], sampled)
            informed = None if reads_text(teacher) else (uv[rows] != ABSTAIN).any(axis=1)
            if self.vote_weight > 0:  # the offsets' rows come without their votes: fitted on its own sample then
                shift_X = None
            elif shift_X is None and len(shift):
                shift_X = take_rows(unlabeled_X, shift)
        else:
            F_unl, P, informed = [b[:0] for b in F_dev], np.zeros((0, self.n_classes)), None
        text = len(self.views)  # the text blocks compete for `max_columns`; the vote block is kept whole
        self.columns_ = frequent_columns((F_unl if F_unl[0].shape[0] > F_dev[0].shape[0] else F_dev)[:text],
                                         self.max_columns)
        if self.columns_ is not None and self.vote_weight > 0:
            self.columns_ = [*self.columns_, None]
        F_dev, F_unl = self._used(F_dev), self._used(F_unl)
        self.n_pseudo_ = int(P.shape[0])
        self.model_ = fit_student(F_dev, y[keep], F_unl, P, self.n_classes, self.C, informed=informed)
        # what `match_prior` would shift by: toward dev's class shares, on unlabeled rows it did not learn from when
        # there are any (on its own sample it is surer of its teacher's classes, so offsets fitted there overshoot)
        unseen = (student_proba(self.model_, F_unl, self.n_classes) if shift_X is None
                  else self._proba(shift_X, None, _n_rows(shift_X)))
        self.prior_bias_ = prior_bias(unseen, class_prior(y[keep], self.n_classes))  # dev's shares, add-one smoothed
        self.n_annotators_ = votes.shape[1]
        return self

    def unlabeled_rows(self, n: int) -> np.ndarray:
        """A seeded sample of at most `max_unlabeled` unlabeled rows (all of them when fewer)."""
        return unlabeled_sample(n, self.seed, self._sample_size())

    def _sample_size(self) -> int:
        return student_sample_size(self.n_classes) if self.max_unlabeled is None else self.max_unlabeled

    def _design(self, X: Features, votes: np.ndarray | None, n_rows: int) -> list[Block]:
        return student_design(X, self.views, n_rows, votes, self.n_classes, self.vote_weight)

    def _proba(self, X: Features, votes: np.ndarray | None, n_rows: int) -> np.ndarray:
        """The student's probabilities for `n_rows` rows of text features (and votes, when it reads them),
        unshifted."""
        return student_proba(self.model_, self._used(self._design(X, votes, n_rows)), self.n_classes)

    def _used(self, F: list[Block]) -> list[Block]:
        return keep_columns(F, self.columns_)

    def predict_proba(self, votes: np.ndarray, X: Features = None, match_prior: bool | None = None) -> np.ndarray:
        """`match_prior` (None: the attribute of that name): shift the probabilities by `prior_bias_`."""
        v = self._votes_for_predict(votes)
        proba = self._proba(X, v, v.shape[0])
        if self.match_prior if match_prior is None else match_prior:
            proba = shifted(proba, self.prior_bias_)
        return proba

