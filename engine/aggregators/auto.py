"""AutoAggregator: a few strong candidates, chosen on rows that can judge them, and an honest estimate of the choice.

The candidates (each logistic regression's C from the same seeded folds):
  the text      the mean of the text-only models, one per text view ("avg(embedding-only,tfidf-only)")
  the pool      the mean of EvoAgg over each text view: the votes beside the text ("avg(evoagg[embedding],...)")
  their students, given unlabeled rows: an LR over the text trained on the teacher's labels of a seeded sample of the
                unlabeled rows plus dev ("student<...>"; per fold the teacher is refitted on the training rows only)
and, without text features, majority vote, weighted MV, Dawid-Skene and EvoAgg over the votes.

Which rows judge a candidate: all dev rows, out of fold, for one that never reads the pool; for one that reads it (a
student of the pool included: its teacher's cues were mined on the dev rows' text), when the pool was chosen on dev
(`votes_selected`), only the audit rows the agents and the gate never saw, and without enough of them it is not
weighed: its dev figure would be the inflated one (a 0.85 fitness over a 0.49 audit figure).

The choice: the best on its rows; unless it beats the runner-up in `confidence` of paired bootstrap draws of the rows
both are judged on, the mean of the two (a win by noise neither gambles nor discards the runner-up).
The estimate (`estimate_`): in each fold the same rule is applied to the other folds' rows only, and the held fold's
judging rows are scored with what it chose there, so the figure is never measured on the rows that chose.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from engine.aggregators.base import (
    Aggregator,
    BaseAggregator,
    Features,
    Predictor,
    check_labels,
    check_votes,
    feature_dict,
    make_folds,
    oof_proba,
    take_rows,
)
from engine.aggregators.choice_names import STUDENT, reads_votes
from engine.aggregators.dawid_skene import DawidSkene
from engine.aggregators.evoagg import EvoAgg, TextOnly
from engine.aggregators.parallel import run_calls
from engine.aggregators.student import StudentAggregator, student_rows, student_sample_size
from engine.aggregators.voting import MajorityVote, WeightedMajorityVote
from engine.domain import AUDIT, AUDIT_MIN_ROWS_TO_JUDGE, Estimate
from engine.metrics.estimate import estimate_by_difference, estimate_macro_f1, paired_wins
from engine.metrics.score import macro_f1

# the student's text views, the first set present: on relation tasks the masked sentence embeddings, the TF-IDF of the
# words between and around the two mentions and the whole text's TF-IDF; else the sentence embeddings and TF-IDF
STUDENT_VIEWS = (("masked", "relation", "tfidf"), ("embedding", "relation", "tfidf"), ("embedding", "tfidf"))
# the student learns from thousands of rows, so it can afford weaker regularisation than the models fitted on dev
STUDENT_C = 10.0
RELATION_VIEWS = ("masked", "relation")
CONFIDENCE = 0.9  # the share of paired bootstrap draws the best must win to be taken alone over the runner-up


def student_views(feats: dict) -> tuple[str, ...]:
    """The text views auto's students read: the first set of STUDENT_VIEWS present, else the first feature."""
    return next((views for views in STUDENT_VIEWS if all(view in feats for view in views)), tuple(feats)[:1])


def teacher_views(feats: dict) -> tuple[str, ...]:
    """The views the text and the pool candidates average: on relation tasks the two that see the entity pair (the
    masked sentence and the words between and around the mentions; a whole-sentence view dilutes the relation, and
    `auto` chose teachers of these two alone on SemEval's dev rows in each seed before this rule), else every view."""
    return RELATION_VIEWS if all(view in feats for view in RELATION_VIEWS) else tuple(feats)


def _oof_at_each_C(make: Callable[[float], Aggregator], Cs: Sequence[float], v: np.ndarray, y: np.ndarray,
                   feats: dict | None, folds: list) -> list[np.ndarray]:
    """A model's out-of-fold probabilities at each C: along the warm-started path where it has one."""
    first = make(Cs[0])
    if hasattr(first, "oof_path"):
        return first.oof_path(v, y, feats, folds, Cs)
    return [oof_proba(partial(make, C), v, y, feats, folds) for C in Cs]


class _Average:
    """The mean of fitted aggregators' probabilities."""

    def __init__(self, members: list[Predictor]):
        self.members = members

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        return np.mean([m.predict_proba(votes, X) for m in self.members], axis=0)


def _taught() -> Aggregator:
    """The teacher factory of a student given its fitted teacher (`fit_from_teacher`): never called."""
    raise AssertionError("a student fitted from its teacher builds no teacher of its own")


def _text_only(k: int, feature: str, seed: int, C: float) -> Aggregator:
    return TextOnly(k, feature=feature, Cs=(C,), seed=seed)


def _evoagg(k: int, feature: str | None, seed: int, C: float) -> Aggregator:
    return EvoAgg(k, feature=feature, Cs=(C,), seed=seed)


def _student_fold(parts: list[Callable[[], Aggregator]], views: tuple[str, ...], n_classes: int, seed: int,
                  v: np.ndarray, y: np.ndarray, feats: dict, train: np.ndarray, held: np.ndarray | None,
                  unlabeled_votes: np.ndarray, unlabeled_X: Features) -> np.ndarray | StudentAggregator:
    """A student's probabilities on the `held` rows, its teacher fitted on the `train` rows only; with `held=None`
    the fitted student itself."""
    sub = {name: mat[train] for name, mat in feats.items()}
    teacher = _Average([make().fit(v[train], y[train], sub) for make in parts])
    student = StudentAggregator(n_classes, _taught, "", views, C=STUDENT_C, seed=seed)
    student.fit_from_teacher(teacher, v[train], y[train], sub, unlabeled_votes, unlabeled_X)
    if held is None:
        return student
    return student.predict_proba(v[held], {name: mat[held] for name, mat in feats.items()}, match_prior=False)


@dataclass(frozen=True)
class _Model:
    """One model auto fits out of fold: its name and a factory of C."""

    name: str
    make: Callable[[float], Aggregator]
    tuned: bool  # C matters: each C in `Cs` is tried


def _mean_name(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else "avg(" + ",".join(names) + ")"


class AutoAggregator(BaseAggregator):
    """Fitted on labeled dev rows. X: a dict of named feature matrices (a bare matrix is named "x")."""

    def __init__(self, n_classes: int, seed: int = 0, n_splits: int = 5, Cs: Sequence[float] = (0.1, 1.0, 10.0, 100.0),
                 min_audit: int = AUDIT_MIN_ROWS_TO_JUDGE, text_only: bool = False, pool_only: bool = False,
                 students: bool = True, confidence: float = CONFIDENCE, bootstrap: int = 200,
                 n_jobs: int | None = None):
        self.n_classes = n_classes
        self.seed = seed
        self.n_splits = n_splits
        self.Cs = Cs
        self.min_audit = min_audit
        self.text_only = text_only  # "auto-text": what the text does without the pool
        self.pool_only = pool_only  # "auto-pool": what reads the pool, chosen alike
        self.students = students
        self.confidence = confidence
        self.bootstrap = bootstrap
        self.n_jobs = n_jobs  # worker processes for the out-of-fold fits (None: the cores, at most 4)

    # ---- the candidates ---------------------------------------------------------------------------------------
    def _models(self, feats: dict | None) -> tuple[list[_Model], list[_Model]]:
        """(text models, pool models): one per text view each; without text, the vote readers."""
        k, seed = self.n_classes, self.seed
        if not feats:
            return [], [_Model("mv", lambda C: MajorityVote(k), False), _Model("wmv", lambda C: WeightedMajorityVote(k),
                                                                               False),
                        _Model("ds", lambda C: DawidSkene(k), False),
                        _Model("evoagg[votes]", partial(_evoagg, k, None, seed), True)]
        views = teacher_views(feats)
        text = [_Model(f"{n}-only", partial(_text_only, k, n, seed), True) for n in views]
        pool = [_Model(f"evoagg[{n}]", partial(_evoagg, k, n, seed), True) for n in views]
        return text, pool

    def _fit_models(self, models: list[_Model], v: np.ndarray, y: np.ndarray, feats: dict | None, folds: list,
                    rows: Callable[[str], np.ndarray]) -> dict[str, tuple[np.ndarray, Callable[[], Aggregator]]]:
        """Each model's out-of-fold probabilities at its best C (scored on its judging rows), and a factory of it."""
        paths = run_calls([(_oof_at_each_C, (m.make, tuple(self.Cs) if m.tuned else (1.0,), v, y, feats, folds))
                           for m in models], self.n_jobs, len(y) * self.n_classes)
        out: dict[str, tuple[np.ndarray, Callable[[], Aggregator]]] = {}
        for model, path in zip(models, paths, strict=True):
            Cs = self.Cs if model.tuned else (1.0,)
            at = rows(model.name)
            scores = [self._f1(y, proba.argmax(axis=1), at) for proba in path]
            best = int(np.argmax(scores))  # ties keep the smaller C
            self.C_[model.name] = float(Cs[best])
            out[model.name] = (path[best], partial(model.make, Cs[best]))
        return out

    def _f1(self, y: np.ndarray, predicted: np.ndarray, rows: np.ndarray) -> float:
        return macro_f1(y[rows], predicted[rows], self.n_classes)

    # ---- fit --------------------------------------------------------------------------------------------------
    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None,
            audit: np.ndarray | None = None, votes_selected: bool = False,
            unlabeled_votes: np.ndarray | None = None, unlabeled_X: Features = None) -> AutoAggregator:
        if y is None:
            raise ValueError("AutoAggregator chooses by dev scores: y is required")
        if self.text_only and self.pool_only:
            raise ValueError("text_only and pool_only exclude each other: choose one")
        v = check_votes(votes, self.n_classes)
        if self.pool_only and v.shape[1] == 0:
            # the last sentence in scikit-learn's words, which its estimator checks expect
            raise ValueError("auto-pool chooses among models that read the pool's votes, and the pool has no "
                             f"annotator: 0 feature(s) (shape={v.shape}) while a minimum of 1 is required.")
        y = check_labels(y, self.n_classes, v.shape[0])
        feats = feature_dict(X) or None
        if self.text_only and not feats:
            raise ValueError("text_only needs text features: pass X")
        keep = np.flatnonzero(y >= 0)
        v, y = v[keep], y[keep]
        feats = None if feats is None else {name: mat[keep] for name, mat in feats.items()}
        audit_rows = None if audit is None else np.flatnonzero(np.asarray(audit, dtype=bool)[keep])
        if audit_rows is not None and len(audit_rows) < self.min_audit:
            audit_rows = None
        pool_judged_on = None  # where what reads the pool is judged: None when nowhere honest
        if not votes_selected:
            pool_judged_on = np.arange(len(y))
        elif audit_rows is not None:
            # a class too small to have audit rows is judged on its dev rows (which lean optimistic) rather than
            # left out: a rare class is most often the weakest, and test's macro-F1 counts it like any other
            missing = np.setdiff1d(np.unique(y), y[audit_rows])
            pool_judged_on = np.union1d(audit_rows, np.flatnonzero(np.isin(y, missing)))
        self.judged_on_ = AUDIT if votes_selected and audit_rows is not None else "dev"  # where the pool is judged
        no_pool = v.shape[1] == 0 and bool(feats)
        text_models, pool_models = self._models(feats)
        # without honest rows for the pool, auto-pool (and auto with no text to read) judges it on dev all the same:
        # it then gives no estimate, since its figure is the inflated one
        honest_pool = pool_judged_on is not None
        if not honest_pool and (self.pool_only or not text_models):
            pool_judged_on = np.arange(len(y))

        def rows(name: str) -> np.ndarray:
            if reads_votes(name):
                assert pool_judged_on is not None, "what reads the pool is fitted only with rows to judge it"
                return pool_judged_on
            return np.arange(len(y))

        folds = make_folds(y, self.n_splits, self.seed)
        self.C_: dict[str, float] = {}
        groups = ([text_models] if not self.pool_only else []) + (
            [pool_models] if not self.text_only and not no_pool and pool_judged_on is not None else [])
        fitted = self._fit_models([m for group in groups for m in group], v, y, feats, folds, rows)
        oof: dict[str, np.ndarray] = {}
        parts: dict[str, list[str]] = {}  # the models each candidate averages (a student: its teacher's)
        for group in groups:
            names = [m.name for m in group]
            for averaged in ([names] if feats else [[n] for n in names]):  # without text: each vote reader alone
                oof[_mean_name(averaged)] = np.mean([fitted[n][0] for n in averaged], axis=0)
                parts[_mean_name(averaged)] = averaged
        students: dict[str, tuple[np.ndarray, StudentAggregator | None]] = {}
        if self.students and feats and unlabeled_votes is not None and len(unlabeled_votes):
            sample, _ = student_rows(len(unlabeled_votes), self.seed, student_sample_size(self.n_classes))
            unlabeled = (unlabeled_votes[sample], take_rows(unlabeled_X, sample))
            students = self._students(list(oof), parts, fitted, v, y, feats, folds, unlabeled)
            for teacher, (proba, _) in students.items():
                oof[f"{STUDENT}{teacher}>"], parts[f"{STUDENT}{teacher}>"] = proba, parts[teacher]
        self.oof_scores_ = {name: round(self._f1(y, p.argmax(axis=1), rows(name)), 4) for name, p in oof.items()}
        members = self._choose(oof, y, rows, np.arange(len(y)))
        self.chosen_ = _mean_name(members)
        self.oof_proba_ = np.mean([oof[m] for m in members], axis=0)
        self.oof_scores_[self.chosen_] = round(self._f1(y, self.oof_proba_.argmax(axis=1), rows(self.chosen_)), 4)
        self.uses_votes_ = reads_votes(self.chosen_) and v.shape[1] > 0
        self.estimate_ = self._nested_estimate(oof, y, rows, folds) if honest_pool or not self.uses_votes_ else None
        self.members_: list[Predictor] = []
        for name in members:
            if name.startswith(STUDENT):
                assert feats, "a student is trained only where there is text to read"
                teacher = name[len(STUDENT):-1]
                model = students[teacher][1] or _student_fold(
                    [fitted[n][1] for n in parts[teacher]], student_views(feats), self.n_classes, self.seed, v, y,
                    feats, np.arange(len(y)), None, *unlabeled)
                assert isinstance(model, StudentAggregator)
                model.teacher_name = teacher
                self.members_.append(model)
            else:
                self.members_.append(_Average([fitted[n][1]().fit(v, y, feats) for n in parts[name]]))
        self.n_annotators_ = v.shape[1]
        return self

    def _students(self, teachers: list[str], parts: dict[str, list[str]], fitted: dict, v: np.ndarray,
                  y: np.ndarray, feats: dict, folds: list, unlabeled: tuple
                  ) -> dict[str, tuple[np.ndarray, StudentAggregator | None]]:
        """Per teacher: its student's out-of-fold probabilities and the student fitted on all of dev (in the same
        batch of worker calls)."""
        folds = folds or [(np.arange(len(y)), np.arange(len(y)))]
        views = student_views(feats)
        calls = []
        for teacher in teachers:
            makers = [fitted[n][1] for n in parts[teacher]]
            calls += [(_student_fold, (makers, views, self.n_classes, self.seed, v, y, feats, train, held,
                                       *unlabeled)) for train, held in [*folds, (np.arange(len(y)), None)]]
        results = iter(run_calls(calls, self.n_jobs, len(y) * self.n_classes))
        out = {}
        for teacher in teachers:
            proba = np.zeros((len(y), self.n_classes))
            for _, held in folds:
                proba[held] = next(results)
            out[teacher] = (proba, next(results))
        return out

    # ---- the choice and its estimate --------------------------------------------------------------------------
    def _choose(self, oof: dict[str, np.ndarray], y: np.ndarray, rows: Callable[[str], np.ndarray],
                allowed: np.ndarray) -> tuple[str, ...]:
        """The best candidate on its judging rows among `allowed`; with the runner-up too (their mean) when the
        paired bootstrap on the rows both are judged on does not separate them. Ties go to the earlier."""
        mask = np.zeros(len(y), dtype=bool)
        mask[allowed] = True

        def judged(name: str) -> np.ndarray:
            at = rows(name)
            return at[mask[at]]

        scored = sorted(((self._f1(y, p.argmax(axis=1), judged(n)), -i, n) for i, (n, p) in enumerate(oof.items())
                         if len(judged(n))), reverse=True)
        if len(scored) < 2:
            return (scored[0][2] if scored else next(iter(oof)),)
        best, runner = scored[0][2], scored[1][2]
        both = np.intersect1d(judged(best), judged(runner))
        wins = paired_wins(y[both], oof[best][both].argmax(axis=1), oof[runner][both].argmax(axis=1),
                           self.n_classes, self.seed, self.bootstrap)
        return (best,) if wins >= self.confidence else (best, runner)

    def _nested_estimate(self, oof: dict[str, np.ndarray], y: np.ndarray, rows: Callable[[str], np.ndarray],
                         folds: list) -> Estimate | None:
        """The rule applied in each fold to the other folds' rows, and each held row predicted by what its fold chose
        there (out of fold: no model saw its label either). Where some fold chose what reads the pool, that can be
        judged on its audit rows only: the estimate is a text model's figure on every row plus the chosen's paired
        lead over it on those rows (`estimate_by_difference`)."""
        predicted = np.full(len(y), -1)
        on_pool = False
        for train, held in folds or [(np.arange(len(y)), np.arange(len(y)))]:
            members = self._choose(oof, y, rows, train)
            predicted[held] = np.mean([oof[m][held] for m in members], axis=0).argmax(axis=1)
            on_pool |= len(rows(_mean_name(members))) < len(y)
        if not on_pool:
            return estimate_macro_f1(y, predicted, self.n_classes, "dev", self.seed)
        text = [n for n in oof if not reads_votes(n)]
        judged = np.zeros(len(y), dtype=bool)
        judged[rows(next(n for n in oof if reads_votes(n)))] = True
        if not text:  # nothing judged on every row to lean on: the audit rows alone
            return estimate_macro_f1(y[judged], predicted[judged], self.n_classes, AUDIT, self.seed)
        reference = next((n for n in text if n.startswith(STUDENT)), text[0])
        return estimate_by_difference(y, predicted, oof[reference].argmax(axis=1), judged, self.n_classes, self.seed)

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        v = self._votes_for_predict(votes)
        feats = feature_dict(X) or None
        return np.mean([m.predict_proba(v, feats) for m in self.members_], axis=0)
