"""Saved soft labels: a labels job's result kept as files under `<workspace>/labels/`, and read back.

Each aggregator's result is two files, `<aggregator>.npz` (probabilities, hard labels, vote counts, example ids)
and `<aggregator>.json` (the aggregator actually used, dev scores, the aggregator comparison, when, and the
`pool_key` of the pool it came from). They live beside the DuckDB workspace rather than in it so the labels
screen loads them fast and a reload keeps them; `pool_key` tells a page when the pool has changed since and
the saved labels are stale. Background jobs (`engine.jobs.start_labels`) write them; pages only read them.
"""
from __future__ import annotations

import hashlib
import io
import json
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.atomic import write_atomically
from engine.domain import DevScores
from engine.store.workspace import Store

LABELS_DIR = "labels"



@dataclass(frozen=True)
class SavedLabels:
    """Soft labels as computed by a labels job, read back from the workspace folder."""

    aggregator: str  # what was asked for ("auto" may resolve to another)
    resolved: str  # the aggregator actually used
    probs: np.ndarray  # (n, k)
    example_ids: tuple[str, ...]
    hard: np.ndarray  # (n,) -1 = no label; multi-label: (n, k) 0/1
    n_votes: np.ndarray  # (n,)
    dev_scores: DevScores
    comparison: pd.DataFrame  # one row per aggregator (may be empty)
    pool_key: str
    created_at: str
    pool_ids: tuple[str, ...] = ()  # the pool that made them (empty: saved before it was recorded)


def pool_key(store: Store) -> str:
    """Fingerprint of what soft labels depend on: the pool, the number of rows and of dev rows, and, once the expert
    labeled rows into dev, which and with which labels (after an undo dev's count can come back with other rows, or
    the same rows labeled otherwise; with none labeled, the key is what it was before rows could move, so labels
    saved then stay current)."""
    return _key(store, store.expert_label_pairs())


def _key(store: Store, moved: list, pool: Sequence[str] | None = None) -> str:
    text = json.dumps([sorted(store.pool_ids() if pool is None else pool), store.count_examples(),
                       store.count_examples("dev")] + ([moved] if moved else []))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key_before_labels(store: Store) -> str:
    """The key as labels saved before 2026-11-27 hold it: the expert's rows by id alone (a relabeled row went
    unnoticed then; taken as current rather than calling every such workspace's labels stale at the upgrade)."""
    return _key(store, [pair[0] for pair in store.expert_label_pairs()])


def stale_reason(store: Store, saved_pool: Sequence[str], key: str) -> str | None:
    """What changed since labels keyed `key` (`pool_key` then) were saved with pool `saved_pool` (empty: saved
    before it was recorded), in the expert's words; None when nothing did. Reads the parts `pool_key` hashes."""
    if key == pool_key(store) or key == _key_before_labels(store):
        return None
    if not saved_pool:
        return "The pool or the rows changed"
    rows = "The rows changed (rows labeled into dev, relabeled or returned to the pool, or rows imported)"
    if sorted(saved_pool) != sorted(store.pool_ids()):
        # both, when the key differs with the saved pool put back (it named the pool alone)
        same_rows = key in (_key(store, store.expert_label_pairs(), saved_pool),
                            _key(store, [pair[0] for pair in store.expert_label_pairs()], saved_pool))
        return "The pool changed" if same_rows else "The pool changed, and " + rows[0].lower() + rows[1:]
    return rows


def _labels_base(workdir: Path, aggregator: str) -> Path:
    return Path(workdir) / LABELS_DIR / aggregator


def save_labels(workdir: str | Path, aggregator: str, result: Any, comparison: Any, key: str,
                pool: Sequence[str] = ()) -> Path:
    """Keep a LabelingResult beside the workspace: arrays in .npz, the rest in .json. `pool`: the ids of the pool
    that made it, for the manifest of a later download (the pool may have changed by then)."""
    base = _labels_base(Path(workdir), aggregator)
    base.parent.mkdir(parents=True, exist_ok=True)
    soft = result.soft
    batch = uuid.uuid4().hex  # in both files: a reader between the two writes sees a mismatch, not a wrong pair
    arrays = io.BytesIO()
    np.savez_compressed(arrays, probs=soft.probs, hard=np.asarray(result.hard), n_votes=np.asarray(result.n_votes),
                        example_ids=np.asarray(soft.example_ids, dtype=str), batch=np.asarray(batch))
    meta = {"aggregator": aggregator, "resolved": soft.aggregator, "pool_key": key, "pool_ids": list(pool),
            "dev_scores": result.dev_scores.to_dict(),
            "comparison": _records(comparison),
            # with its zone, like the manifest's other times (a reader cannot tell naive UTC from local time)
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"), "batch": batch}
    # the .json first: the studio caches on the .npz's time, so the pair it caches is the finished one
    write_atomically(base.with_suffix(".json"), json.dumps(meta, default=_json_default).encode("utf-8"))
    write_atomically(base.with_suffix(".npz"), arrays.getvalue())
    return base


def _records(comparison: Any) -> list[dict]:
    """compare_aggregators' rows (a list of dicts or a DataFrame) as plain records."""
    if comparison is None:
        return []
    if isinstance(comparison, pd.DataFrame):
        return comparison.to_dict(orient="records")
    return [dict(row) for row in comparison]


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def load_labels(workdir: str | Path, aggregator: str) -> SavedLabels | None:
    """The saved soft labels for `aggregator`, or None (never computed, or unreadable)."""
    base = _labels_base(Path(workdir), aggregator)
    if not base.with_suffix(".npz").exists() or not base.with_suffix(".json").exists():
        return None
    try:
        meta = json.loads(base.with_suffix(".json").read_text())
        with np.load(base.with_suffix(".npz")) as arrays:
            if "batch" in arrays and str(arrays["batch"]) != meta.get("batch"):
                return None  # read between a recompute's two writes
            return SavedLabels(aggregator, meta["resolved"], arrays["probs"], tuple(arrays["example_ids"].tolist()),
                               arrays["hard"], arrays["n_votes"],
                               DevScores.from_dict(meta.get("dev_scores")),
                               pd.DataFrame.from_records(meta.get("comparison", [])), meta["pool_key"],
                               meta.get("created_at", ""), tuple(meta.get("pool_ids", ())))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
