"""Aggregators by name: the registry the CLI, jobs and studio use to turn votes into soft labels.

Every aggregator follows the scikit-learn contract: ``fit(votes, y, X=None) -> self`` and
``predict_proba(votes, X=None) -> (n, k)`` with rows summing to 1. votes: (n, m) int, ABSTAIN = -1.
X (text features) is None, one matrix, or a dict of named matrices, e.g. ``{"embedding": E, "tfidf": T}``;
see engine/aggregators/base.py. The implementations live in engine/aggregators/.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.aggregators import (
    Aggregator,
    AutoAggregator,
    DawidSkene,
    EmbeddingOnly,
    EvoAgg,
    MajorityVote,
    MultiLabelEvoAgg,
    TfidfFeatures,
    WeightedMajorityVote,
    expected_calibration_error,
    predict_labels,
    reliability,
)

_REGISTRY: dict[str, tuple[str, Callable[[int, int], Aggregator]]] = {
    "mv": ("majority vote", lambda k, seed: MajorityVote(k)),
    "wmv": ("weighted majority vote (log-odds of dev accuracy)", lambda k, seed: WeightedMajorityVote(k)),
    "ds": ("Dawid-Skene (EM over confusion matrices)", lambda k, seed: DawidSkene(k)),
    "evoagg": ("EvoAgg: logistic regression over embeddings + one-hot votes", lambda k, seed: EvoAgg(k, seed=seed)),
    "embedding": ("text embeddings only (ignores the votes)", lambda k, seed: EmbeddingOnly(k, seed=seed)),
    "auto": ("the best of these (and TF-IDF views) by out-of-fold macro-F1 on the audit rows",
             lambda k, seed: AutoAggregator(k, seed=seed)),
    "auto-text": ("the best of the text-only models (students of text-only teachers included): no pool votes",
                  lambda k, seed: AutoAggregator(k, seed=seed, text_only=True)),
}
AGGREGATORS: tuple[str, ...] = tuple(_REGISTRY)
DESCRIPTIONS: dict[str, str] = {name: desc for name, (desc, _) in _REGISTRY.items()}
NEEDS_LABELS: frozenset[str] = frozenset({"wmv", "evoagg", "embedding", "auto", "auto-text"})
USES_FEATURES: frozenset[str] = frozenset({"evoagg", "embedding", "auto", "auto-text"})


def make_aggregator(name: str, n_classes: int, seed: int = 0) -> Aggregator:
    """A fresh, unfitted aggregator by registry name."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown aggregator {name!r}; choose one of {', '.join(AGGREGATORS)}")
    return _REGISTRY[name][1](n_classes, seed)


__all__ = [
    "AGGREGATORS", "DESCRIPTIONS", "NEEDS_LABELS", "USES_FEATURES", "Aggregator", "AutoAggregator", "DawidSkene",
    "EmbeddingOnly", "EvoAgg", "MajorityVote", "MultiLabelEvoAgg", "TfidfFeatures", "WeightedMajorityVote",
    "expected_calibration_error", "make_aggregator", "predict_labels", "reliability",
]
