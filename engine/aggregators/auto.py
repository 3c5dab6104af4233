"""AutoAggregator: let honest dev scores pick the aggregator.

Every candidate is scored by out-of-fold macro-F1 on dev, with the same seeded folds for all:
majority vote, weighted MV, Dawid-Skene, EvoAgg on votes only, and for each named feature matrix in X
(e.g. "embedding", "tfidf") the text-only model ("<name>-only") and EvoAgg over it ("evoagg[<name>]").
The best wins (ties go to the simpler, earlier candidate); an average of the top 2..top_k candidates'
probabilities replaces it only if that scores strictly higher out-of-fold. So on the rows it is judged on
the choice is never worse than the best single ingredient it weighed.

Audit rows: when the pool was evolved on the same dev rows (the agents mine cues there and the gate keeps
what scores well there), vote-based candidates look far better out-of-fold than they are on new data.
`fit(..., audit=mask)` names dev rows the agents and the gate never saw; with at least `min_audit` of them,
candidates are ranked by their out-of-fold macro-F1 on those rows only, which is free of that bias.
Without enough audit rows, `votes_selected=True` (the pool was chosen on these rows) leaves out the
candidates that read nothing but the votes (mv, wmv, ds, evoagg[votes]) whenever text features are given:
their dev figures are the inflated ones, while EvoAgg's text block tempers its trust in the votes. (Before that
rule and with no audit rows, auto picked majority vote on SMS and ChemProt for every seed and lost to EvoAgg
on test each time:
bench/results/audit_ablation_32eb1af.md.)

The logistic-regression candidates get their C from the same folds: each C in `Cs` is scored out-of-fold
and the best one's score stands for the candidate (one choice among a few values: slightly optimistic,
but many times cheaper than nested CV, which `EvoAgg.oof_predict_proba` offers for a single model).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.aggregators.base import (
    Aggregator,
    BaseAggregator,
    Features,
    check_labels,
    check_votes,
    feature_dict,
    make_folds,
    oof_proba,
)
from engine.aggregators.dawid_skene import DawidSkene
from engine.aggregators.evoagg import EvoAgg, TextOnly
from engine.aggregators.voting import MajorityVote, WeightedMajorityVote
from engine.domain import AUDIT_MIN_ROWS_TO_JUDGE
from engine.score import macro_f1


@dataclass(frozen=True)
class Ingredient:
    """One ingredient auto weighs: its name in the scores, a factory of C, and what it reads."""

    name: str
    make: Callable[[float], Aggregator]
    tuned: bool  # whether C matters (then each C in `Cs` is scored)
    reads_text: bool  # False: it reads nothing but the votes


class AutoAggregator(BaseAggregator):
    """Fitted on labeled dev rows. X: a dict of named feature matrices (a bare matrix is named "x")."""

    def __init__(self, n_classes: int, seed: int = 0, n_splits: int = 5, Cs: Sequence[float] = (0.1, 1.0, 10.0, 100.0),
                 top_k: int = 3, min_audit: int = AUDIT_MIN_ROWS_TO_JUDGE):
        self.n_classes = n_classes
        self.seed = seed
        self.n_splits = n_splits
        self.Cs = Cs
        self.top_k = top_k
        self.min_audit = min_audit

    def candidates(self, X: Features) -> list[Ingredient]:
        """Every ingredient for these features, simplest first."""
        k, seed = self.n_classes, self.seed
        out = [
            Ingredient("mv", lambda C: MajorityVote(k), tuned=False, reads_text=False),
            Ingredient("wmv", lambda C: WeightedMajorityVote(k), tuned=False, reads_text=False),
            Ingredient("ds", lambda C: DawidSkene(k), tuned=False, reads_text=False),
            Ingredient("evoagg[votes]", lambda C: EvoAgg(k, feature=None, Cs=(C,), seed=seed), tuned=True,
                      reads_text=False),
        ]
        for name in feature_dict(X):
            out.append(Ingredient(f"{name}-only", lambda C, name=name: TextOnly(k, feature=name, Cs=(C,), seed=seed),
                                 tuned=True, reads_text=True))
            out.append(Ingredient(f"evoagg[{name}]",
                                 lambda C, name=name: EvoAgg(k, feature=name, Cs=(C,), seed=seed),
                                 tuned=True, reads_text=True))
        return out

    def fit(self, votes: np.ndarray, y: np.ndarray | None = None, X: Features = None,
            audit: np.ndarray | None = None, votes_selected: bool = False) -> AutoAggregator:
        if y is None:
            raise ValueError("AutoAggregator chooses by dev scores: y is required")
        v = check_votes(votes, self.n_classes)
        y = check_labels(y, self.n_classes, v.shape[0])
        feats = feature_dict(X) or None
        keep = np.flatnonzero(y >= 0)
        v, y = v[keep], y[keep]
        feats = None if feats is None else {name: mat[keep] for name, mat in feats.items()}
        judged = self._judged_rows(audit, keep)
        self.judged_on_ = "audit" if judged is not None else "dev"
        rows = judged if judged is not None else np.arange(len(y))

        def score_of(proba: np.ndarray) -> float:
            return macro_f1(y[rows], proba[rows].argmax(axis=1), self.n_classes)

        folds = make_folds(y, self.n_splits, self.seed)
        oof: dict[str, np.ndarray] = {}
        scores: dict[str, float] = {}
        makers: dict[str, Callable[[], Aggregator]] = {}
        self.C_ = {}
        candidates = self.candidates(feats)
        self.left_out_ = []
        if votes_selected and judged is None and feats:
            self.left_out_ = [c.name for c in candidates if not c.reads_text]
            candidates = [c for c in candidates if c.reads_text]
        for candidate in candidates:
            name, make, tuned = candidate.name, candidate.make, candidate.tuned
            for C in (self.Cs if tuned else (1.0,)):
                proba = oof_proba(lambda make=make, C=C: make(C), v, y, feats, folds)
                score = score_of(proba)
                if name not in scores or score > scores[name]:  # ties keep the earlier (smaller) C
                    oof[name], scores[name] = proba, score
                    makers[name] = lambda make=make, C=C: make(C)
                    if tuned:
                        self.C_[name] = float(C)
        ranked = sorted(scores, key=lambda name: -scores[name])  # stable: ties keep the simpler first
        chosen, members = ranked[0], [ranked[0]]
        for top in range(2, min(self.top_k, len(ranked)) + 1):
            names = ranked[:top]
            name = "avg(" + ",".join(names) + ")"
            oof[name] = np.mean([oof[n] for n in names], axis=0)
            scores[name] = score_of(oof[name])
            if scores[name] > scores[chosen] + 1e-12:
                chosen, members = name, names
        self.oof_scores_ = scores
        self.oof_proba_ = oof[chosen]  # honest dev probabilities of the chosen aggregator
        self.chosen_ = chosen
        self.members_ = [makers[n]().fit(v, y, feats) for n in members]
        self.n_annotators_ = v.shape[1]
        return self

    def _judged_rows(self, audit: np.ndarray | None, keep: np.ndarray) -> np.ndarray | None:
        """Positions (among the labeled rows) of the audit rows, or None when there are too few to judge on."""
        if audit is None:
            return None
        rows = np.flatnonzero(np.asarray(audit, dtype=bool)[keep])
        return rows if len(rows) >= self.min_audit else None

    def predict_proba(self, votes: np.ndarray, X: Features = None) -> np.ndarray:
        v = self._votes_for_predict(votes)
        feats = feature_dict(X) or None
        return np.mean([m.predict_proba(v, feats) for m in self.members_], axis=0)
