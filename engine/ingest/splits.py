"""Split drawing at import: filling in missing splits, capping dev (seeded, stratified), marking audit rows.

`assign_splits` decides which rows are `pool` (unlabeled work), `dev` (the labeled fitness set) and `test`
(holdout); `mark_audit` then holds a seeded share of each class's dev rows back from the agents and the gate.
Both are pure functions of a validated frame and a seed, kept apart from `engine.ingest.importer` (which validates rows
and writes the workspace) so the sampling rules and their thresholds can be read, and reused by the benchmarks,
on their own.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.domain import AUDIT_MIN_ROWS_TO_JUDGE
from engine.ingest.errors import IngestError

AUDIT_MIN_CLASS_ROWS = 10  # a class needs this many dev rows before any of them is held back as audit


def to_draw(frame: pd.DataFrame) -> pd.Series:
    """The rows `assign_splits` draws dev and test from: labeled, with no split of the file's own."""
    return frame["split"].isna() & frame["label"].notna()


def assign_splits(frame: pd.DataFrame, dev_size: int, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """Fill in missing splits and cap the dev split at `dev_size` (seeded, stratified by (first) label).

    Rows without a split: unlabeled → pool; labeled → a stratified dev sample, the rest → test.
    Dev rows beyond `dev_size` move to the pool with their labels dropped (the pool is unlabeled).
    Labels on pool rows are dropped too, so nothing downstream can lean on them.
    """
    rng = np.random.default_rng(seed)
    frame = frame.copy()
    notes = []
    free = frame.index[to_draw(frame)]
    frame.loc[frame["split"].isna() & frame["label"].isna(), "split"] = "pool"
    if len(free):
        picked = _stratified(frame.loc[free, "label"], dev_size - int((frame["split"] == "dev").sum()), rng)
        frame.loc[picked, "split"] = "dev"
        frame.loc[free.difference(picked), "split"] = "test"
        notes.append(f"drew a stratified dev split of {len(picked)} labeled rows; {len(free) - len(picked)} "
                     "other labeled rows became the test (holdout) split")
    dev = frame.index[frame["split"] == "dev"]
    if len(dev) > dev_size:
        keep = _stratified(frame.loc[dev, "label"], dev_size, rng)
        moved = dev.difference(keep)
        frame.loc[moved, "split"] = "pool"
        notes.append(f"dev split subsampled to {dev_size} rows (seeded, stratified); {len(moved)} rows moved to pool")
    pool_labeled = (frame["split"] == "pool") & frame["label"].notna()
    if pool_labeled.any():
        notes.append(f"ignored the labels of {int(pool_labeled.sum())} pool rows (the pool is unlabeled work)")
        frame.loc[pool_labeled, "label"] = None
        if "label_set" in frame:
            frame.loc[pool_labeled, "label_set"] = None
    return frame, notes


def no_dev_reason(rows: pd.DataFrame, dev_size: int) -> str:
    """Why `assign_splits` put no row of `rows` (validated, splits not yet drawn) in dev, in the rows' own terms."""
    labeled = rows.loc[rows["label"].notna(), "split"]
    if labeled.empty:
        return ("no labeled rows, so there is no dev split to measure annotators on; add a label column with at "
                "least a few labeled rows per class")
    if dev_size < 1:
        return (f"dev size {dev_size}: none of the {len(labeled)} labeled rows goes to dev, so there is nothing to "
                "measure annotators on; ask for a dev split of at least a few rows per class")
    # a labeled row with no split would have been drawn into dev: each has one, and none says dev
    return (f"none of the {len(labeled)} labeled rows is a dev row: by their split, {int((labeled == 'test').sum())} "
            f"are test (holdout) rows and {int((labeled == 'pool').sum())} pool rows, whose labels are ignored (the "
            "pool is unlabeled work); give some labeled rows the split dev (in a WRENCH folder: a valid.json), or "
            "leave their split blank to have dev drawn from them")


def _stratified(labels: pd.Series, size: int, rng: np.random.Generator) -> pd.Index:
    """A seeded sample of `size` index entries with class shares as in `labels` (each class ≥ 1 if possible)."""
    size = max(0, min(size, len(labels)))
    if size == len(labels):
        return labels.index
    picked: list = []
    groups = {k: rng.permutation(v.to_numpy()) for k, v in labels.groupby(labels).groups.items()}
    quotas = {k: max(1, int(round(size * len(v) / len(labels)))) for k, v in groups.items()}
    while sum(quotas.values()) > size:  # rounding overshoot: trim the largest classes
        quotas[max(quotas, key=lambda c: quotas[c])] -= 1
    for k, members in groups.items():
        picked.extend(members[: quotas[k]])
    leftover = rng.permutation(np.setdiff1d(labels.index.to_numpy(), np.array(picked, dtype=labels.index.dtype)))
    picked.extend(leftover[: size - len(picked)])
    return pd.Index(sorted(picked))


def mark_audit(frame: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.Series, list[str]]:
    """Pick the audit rows: floor(fraction * n) of each class's dev rows, seeded.

    The agents and the gate never see them, so the pool is not selected on them and the auto aggregator
    can compare vote-based and text-based aggregators honestly there. Classes with fewer than
    AUDIT_MIN_CLASS_ROWS dev rows give none (their few rows are worth more to the agents), and when the
    share would come to fewer than AUDIT_MIN_ROWS_TO_JUDGE rows no row is held back: a macro-F1 on so few rows is
    too noisy to choose an aggregator by, so the agents get them all.
    """
    if not 0 <= fraction < 1:
        raise IngestError(f"audit_fraction must be in [0, 1), got {fraction}")
    audit = pd.Series(False, index=frame.index)
    rng = np.random.default_rng(seed + 7919)  # not the split draw's stream
    dev = frame[frame["split"] == "dev"]
    for _, rows in sorted(dev.groupby("label").groups.items()):
        take = int(np.floor(fraction * len(rows))) if len(rows) >= AUDIT_MIN_CLASS_ROWS else 0
        audit[rng.permutation(np.asarray(rows))[:take]] = True
    if 0 < audit.sum() < AUDIT_MIN_ROWS_TO_JUDGE:
        return pd.Series(False, index=frame.index), [
            f"no audit rows: {int(audit.sum())} would be too few to choose an aggregator on (fewer than "
            f"{AUDIT_MIN_ROWS_TO_JUDGE}), so the agents get all {len(dev)} dev rows"]
    notes = []
    if audit.any():
        notes.append(f"held back {int(audit.sum())} of {len(dev)} dev rows as audit rows: the agents and the gate "
                     "never see them; the auto aggregator chooses on them")
    return audit, notes
