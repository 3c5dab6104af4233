"""Aggregators by name: the registry the CLI, jobs and studio use to turn votes into soft labels.

Every aggregator follows the scikit-learn contract: ``fit(votes, y, X=None) -> self`` and
``predict_proba(votes, X=None) -> (n, k)`` with rows summing to 1. votes: (n, m) int, ABSTAIN = -1.
Votes and labels go through scikit-learn's `check_array` (dense, 2-D, finite, at least one row to fit);
predicting before `fit` raises `NotFittedError`. tests/test_aggregators_sklearn.py runs scikit-learn's own
estimator checks over every aggregator.
X (text features) is None, one matrix, or a dict of named matrices, e.g. ``{"embedding": E, "tfidf": T}``;
see engine/aggregators/base.py. The implementations live in engine/aggregators/.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.aggregators import (
    Aggregator,
    AutoAggregator,
    DawidSkene,
    EvoAgg,
    MajorityVote,
    MultiLabelEvoAgg,
    TextOnly,
    TfidfFeatures,
    WeightedMajorityVote,
    expected_calibration_error,
    predict_labels,
    reliability,
)


@dataclass(frozen=True)
class AggregatorEntry:
    """One registry entry: the aggregator's name, what it reads, and how to build a fresh one."""

    name: str
    description: str
    factory: Callable[[int, int], Aggregator]  # (n_classes, seed) -> unfitted aggregator
    reads_votes: bool = True  # False: the text alone decides
    reads_text: bool = False  # reads text features (X)
    needs_labels: bool = False  # fitted on dev labels (without them it cannot fit)
    fits_unlabeled: bool = False  # fitted on every row's votes, without labels (Dawid-Skene)
    chooses: bool = False  # chooses among candidates on dev (audit rows where there are enough) and may teach a
    # student on the unlabeled rows: it is given the audit mask and the pool rows' votes and text

    @property
    def votes_only(self) -> bool:
        """Reads nothing but the votes, so it gives one label per row and none where nobody voted."""
        return self.reads_votes and not self.reads_text

    @property
    def evoagg_on_multi_label(self) -> bool:
        """A chooser that reads the votes (`auto`, `auto-pool`): on a multi-label task it is MultiLabelEvoAgg, so it
        is named "auto:evoagg" and left out of comparisons beside `evoagg` itself."""
        return self.chooses and self.reads_votes

    def make(self, n_classes: int, seed: int = 0) -> Aggregator:
        return self.factory(n_classes, seed)


_ENTRIES = (
    AggregatorEntry("mv", "majority vote", lambda k, seed: MajorityVote(k)),
    AggregatorEntry("wmv", "weighted majority vote (log-odds of dev accuracy)",
                    lambda k, seed: WeightedMajorityVote(k), needs_labels=True),
    AggregatorEntry("ds", "Dawid-Skene (EM over confusion matrices)", lambda k, seed: DawidSkene(k),
                    fits_unlabeled=True),
    AggregatorEntry("evoagg", "EvoAgg: logistic regression over embeddings + one-hot votes (the votes held on a "
                    "shorter leash: the pool was chosen on dev)",
                    lambda k, seed: EvoAgg(k, seed=seed), reads_text=True, needs_labels=True),
    AggregatorEntry("embedding", "text embeddings only (ignores the votes)", lambda k, seed: TextOnly(k, seed=seed),
                    reads_votes=False, reads_text=True, needs_labels=True),
    AggregatorEntry("auto", "the best of these (TF-IDF views and students of the best included) by out-of-fold "
                    "macro-F1: on the audit rows where there are enough, else on dev without what reads only the votes "
                    "the pool was chosen on",
                    lambda k, seed: AutoAggregator(k, seed=seed), reads_text=True, needs_labels=True, chooses=True),
    AggregatorEntry("auto-text", "the best of the text-only models (students of text-only teachers included): "
                    "what the text does without the pool", lambda k, seed: AutoAggregator(k, seed=seed, text_only=True),
                    reads_votes=False, reads_text=True, needs_labels=True, chooses=True),
    AggregatorEntry("auto-pool", "the best of the models that read the pool's votes (students of their teachers "
                    "included), chosen like auto: what the pool does, beside auto-text",
                    lambda k, seed: AutoAggregator(k, seed=seed, pool_only=True), reads_text=True, needs_labels=True,
                    chooses=True),
)
ENTRIES: Mapping[str, AggregatorEntry] = {entry.name: entry for entry in _ENTRIES}
AGGREGATORS: tuple[str, ...] = tuple(ENTRIES)
DEFAULT_AGGREGATOR = "auto"  # what the studio and `evopool eval/export` label with unless told otherwise
DESCRIPTIONS: dict[str, str] = {name: entry.description for name, entry in ENTRIES.items()}


def aggregator_entry(name: str) -> AggregatorEntry:
    """The registry entry of `name`; an unknown name is an error that lists the known ones."""
    if name not in ENTRIES:
        raise ValueError(f"unknown aggregator {name!r}; choose one of {', '.join(AGGREGATORS)}")
    return ENTRIES[name]


def make_aggregator(name: str, n_classes: int, seed: int = 0) -> Aggregator:
    """A fresh, unfitted aggregator by registry name."""
    return aggregator_entry(name).make(n_classes, seed)


__all__ = [
    "AGGREGATORS", "DESCRIPTIONS", "ENTRIES", "Aggregator", "AggregatorEntry", "AutoAggregator", "DawidSkene",
    "EvoAgg", "MajorityVote", "MultiLabelEvoAgg", "TextOnly", "TfidfFeatures", "WeightedMajorityVote",
    "aggregator_entry", "expected_calibration_error", "make_aggregator", "predict_labels", "reliability",
]
