"""Aggregators: votes (and optionally text features) in, soft labels out. See engine/aggregators/registry.py."""
from engine.aggregators.auto import AutoAggregator
from engine.aggregators.base import Aggregator, BaseAggregator, Features, make_folds, oof_proba
from engine.aggregators.calibration import expected_calibration_error, reliability
from engine.aggregators.dawid_skene import DawidSkene
from engine.aggregators.evoagg import EvoAgg, MultiLabelEvoAgg, TextOnly, predict_labels
from engine.aggregators.features import TfidfFeatures
from engine.aggregators.voting import MajorityVote, WeightedMajorityVote

__all__ = [
    "Aggregator", "AutoAggregator", "BaseAggregator", "DawidSkene", "EvoAgg", "Features", "MajorityVote",
    "MultiLabelEvoAgg", "TextOnly", "TfidfFeatures", "WeightedMajorityVote", "expected_calibration_error",
    "make_folds", "oof_proba", "predict_labels", "reliability",
]
