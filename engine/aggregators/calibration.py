"""Calibration of soft labels: do 80%-confident labels come out right 80% of the time?"""
from __future__ import annotations

import numpy as np
import pandas as pd


def reliability(y_true: np.ndarray, proba: np.ndarray, n_bins: int = 10) -> pd.DataFrame:
    """One row per equal-width confidence bin: bounds, mean confidence, accuracy and row count.

    Confidence is the top probability of each row; empty bins have count 0 and NaN confidence/accuracy.
    """
    y_true = np.asarray(y_true, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    confidence = proba.max(axis=1) if proba.size else np.zeros(0)
    correct = (proba.argmax(axis=1) == y_true) if proba.size else np.zeros(0, dtype=bool)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # bins are (lower, upper]; a confidence of exactly 0 goes in the first bin
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    rows = []
    for b in range(n_bins):
        mask = which == b
        count = int(mask.sum())
        rows.append({
            "bin_lower": edges[b],
            "bin_upper": edges[b + 1],
            "confidence": float(confidence[mask].mean()) if count else np.nan,
            "accuracy": float(correct[mask].mean()) if count else np.nan,
            "count": count,
        })
    return pd.DataFrame(rows)


def expected_calibration_error(y_true: np.ndarray, proba: np.ndarray, n_bins: int = 10) -> float:
    """Row-weighted mean |accuracy - confidence| over the reliability bins (0 = perfectly calibrated)."""
    table = reliability(y_true, proba, n_bins)
    total = table["count"].sum()
    if total == 0:
        return 0.0
    used = table[table["count"] > 0]
    return float((used["count"] * (used["accuracy"] - used["confidence"]).abs()).sum() / total)
