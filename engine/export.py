"""Files out: the labeled dataset (with soft labels and provenance), a manifest, and the pool as a .py file.

A multi-label export has a `labels` column (every class predicted for the row, joined by the import's
label separator) where a single-label export has `label`.
"""
from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from engine.domain import ABSTAIN, SoftLabels
from engine.store.workspace import Store

FORMATS = ("csv", "jsonl", "parquet")


def probability_column(label: str) -> str:
    return f"p_{label}"


def label_separator(store: Store) -> str:
    """What joins a multi-label row's labels in files: the separator its data was imported with."""
    return (store.get_meta("ingest") or {}).get("label_separator") or "|"


def confidence(probs: np.ndarray, hard: np.ndarray) -> np.ndarray:
    """(n,) how sure each row's hard label is: its probability (0 where there is none). Multi-label (hard is
    (n, k)): the least certain per-class decision, min over classes of max(p, 1 - p)."""
    if hard.ndim == 2:
        return np.maximum(probs, 1 - probs).min(axis=1) if probs.shape[1] else np.ones(len(probs))
    return np.where(hard != ABSTAIN, probs.max(axis=1), 0.0)


def labeled_frame(store: Store, soft: SoftLabels, hard: np.ndarray, n_votes: np.ndarray) -> pd.DataFrame:
    """One row per example: id, text, split, hard label, confidence, per-class probabilities, votes, provenance.

    `hard` is ABSTAIN where the aggregator gives no label (a vote-only aggregator on a row nobody voted on).
    A multi-label `hard` is (n, k) 0/1: the frame gets `labels` (the predicted set) instead of `label`.
    """
    task = store.load_task()
    frame = store.examples_frame()
    position = pd.Series(np.arange(len(soft.example_ids)), index=pd.Index(soft.example_ids))
    order = position[frame["id"]].to_numpy()
    probs, hard, n_votes = soft.probs[order], hard[order], n_votes[order]
    out = pd.DataFrame({"id": frame["id"], "text": frame["text"], "split": frame["split"]})
    for name in task.fields:
        out[name] = [json.dumps(f.get(name)) if isinstance(f.get(name), (list, dict)) else f.get(name)
                     for f in frame["fields"]]
    if hard.ndim == 2:
        sep = label_separator(store)
        out["labels"] = [sep.join(task.labels[c] for c in np.flatnonzero(row)) for row in hard]
    else:
        out["label"] = [task.labels[h] if h != ABSTAIN else "" for h in hard]
    out["confidence"] = confidence(probs, hard).round(6)
    for k, label in enumerate(task.labels):
        out[probability_column(label)] = probs[:, k].round(6)
    out["n_votes"] = n_votes
    out["aggregator"] = soft.aggregator
    out["gold_label"] = dev_gold(store, frame, task.labels, task.multi_label)
    return out


def dev_gold(store: Store, frame: pd.DataFrame, labels: tuple[str, ...], multi_label: bool) -> list[str]:
    """The expert's own label of each dev row (its label set, joined, on a multi-label task); "" elsewhere.

    Test (holdout) rows keep theirs out of the file: they exist to measure the labels, not to be handed on."""
    sep = label_separator(store)
    gold = []
    for split, label, label_set in zip(frame["split"], frame["label"], frame["label_set"], strict=True):
        if split != "dev" or pd.isna(label):
            gold.append("")
        elif multi_label and label_set:
            gold.append(sep.join(labels[c] for c in label_set))
        else:
            gold.append(labels[int(label)])
    return gold


def verdict_record(store: Store) -> dict:
    """For the manifest: why each pool member is there (the deciding verdict and its reasons), and every
    override the expert made against the gate, with the reason they typed."""
    verdicts = store.verdicts()
    pool = set(store.pool_ids())
    latest = verdicts.groupby("annotator_id").tail(1) if not verdicts.empty else verdicts
    members = {row.annotator_id: {"verdict": row.verdict, "decided_by": row.decided_by,
                                  "reasons": list(row.reasons), "note": row.note or ""}
               for row in latest.itertuples() if row.annotator_id in pool}
    human = verdicts[verdicts["decided_by"] == "human"] if not verdicts.empty else verdicts
    overrides = [{"annotator_id": row.annotator_id, "generation": int(row.generation), "verdict": row.verdict,
                  "note": row.note or "", "recorded_at": str(row.recorded_at)[:19]}
                 for row in human.itertuples()]
    return {"pool_verdicts": members, "expert_overrides": overrides}


def frame_bytes(frame: pd.DataFrame, fmt: str) -> bytes:
    """The labeled frame as the bytes of a CSV, JSONL or Parquet file (for a download button or a file)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    buffer = io.BytesIO()
    if fmt == "csv":
        frame.to_csv(buffer, index=False)
    elif fmt == "jsonl":
        frame.to_json(buffer, orient="records", lines=True, force_ascii=False)
    else:
        frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def write_frame(frame: pd.DataFrame, out: str | Path, fmt: str | None = None) -> Path:
    out = Path(out)
    fmt = (fmt or out.suffix.lstrip(".") or "csv").lower()
    data = frame_bytes(frame, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def manifest(store: Store, soft: SoftLabels, frame: pd.DataFrame, extra: dict | None = None,
             threshold: float | None = None) -> dict:
    """Provenance of an export: which pool, which aggregator, when, and how many rows per split.

    A multi-label export also records `multi_label: true`, the threshold and the label separator.
    """
    pool = store.pool_ids()
    multi = store.load_task().multi_label
    return {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "workspace": str(store.path),
        "task": store.load_task().name,
        "labels": list(store.load_task().labels),
        "aggregator": soft.aggregator,
        "generation": store.last_complete_generation(),
        "pool": [{"id": a.id, "name": a.name, "agent": a.agent, "author": a.author, "written_by": a.provenance}
                 for a in store.annotators(pool)],
        "rows": int(len(frame)),
        "rows_per_split": {k: int(v) for k, v in frame["split"].value_counts().items()},
        "unlabeled_rows": int((frame["labels" if multi else "label"] == "").sum()),
        **({"multi_label": True, "threshold": threshold, "label_separator": label_separator(store)} if multi else {}),
        **verdict_record(store),
        **(extra or {}),
    }


def write_export(store: Store, soft: SoftLabels, hard: np.ndarray, n_votes: np.ndarray, out: str | Path,
                 fmt: str | None = None, extra: dict | None = None,
                 threshold: float | None = None) -> tuple[Path, Path]:
    """Write the labeled dataset and a `<file>.manifest.json` beside it (threshold: multi-label only)."""
    frame = labeled_frame(store, soft, hard, n_votes)
    path = write_frame(frame, out, fmt)
    manifest_path = path.with_name(path.name + ".manifest.json")
    manifest_path.write_text(json.dumps(manifest(store, soft, frame, extra, threshold), indent=2))
    return path, manifest_path


def pool_as_python(store: Store) -> str:
    """The current pool as one runnable module: each annotator, majority-vote `label(example)` and the
    multi-label `labels(example)` (every label voted); run as a script it writes the one the task uses.

    Each annotator's source is kept verbatim in its own namespace so helper names cannot collide.
    """
    task = store.load_task()
    annotators = store.annotators(store.pool_ids())
    lines = [
        f'"""EvoPool annotator pool for task {task.name!r}: {len(annotators)} annotators.',
        "",
        "Exported by EvoPool Studio. Usage: python this_file.py < examples.jsonl > labels.jsonl",
        '(each input line a JSON object with "text" and the task\'s fields)."""',
        "import json",
        "import sys",
        "from collections import Counter",
        "",
        f"LABELS = {list(task.labels)!r}",
        "SOURCES = {}",
        "",
    ]
    for a in annotators:
        lines.append(f"# {a.name} — {a.agent}, generation {a.generation}, author {a.author}, "
                     f"written by {a.provenance}, id {a.id}")
        lines.append(f"SOURCES[{a.id!r}] = {a.source!r}")
        lines.append("")
    lines += [
        "ANNOTATORS = {}",
        "for _id, _src in SOURCES.items():",
        "    _ns = {}",
        "    exec(compile(_src, _id, 'exec'), _ns)",
        "    ANNOTATORS[_id] = _ns['annotate']",
        "",
        "",
        "def votes(example):",
        '    """Each annotator\'s vote (a label name or None)."""',
        "    out = {}",
        "    for _id, fn in ANNOTATORS.items():",
        "        try:",
        "            out[_id] = fn(example)",
        "        except Exception:",
        "            out[_id] = None",
        "    return out",
        "",
        "",
        "def label(example):",
        '    """Majority vote over the pool; ties go to the label listed first; None when all abstain."""',
        "    counts = Counter(v for v in votes(example).values() if v in LABELS)",
        "    if not counts:",
        "        return None",
        "    best = max(counts.values())",
        "    return next(lab for lab in LABELS if counts.get(lab) == best)",
        "",
        "",
        "def labels(example):",
        '    """Multi-label: every label some annotator voted, in label-set order (the rule the gate scores)."""',
        "    voted = set(votes(example).values())",
        "    return [lab for lab in LABELS if lab in voted]",
        "",
        "",
        'if __name__ == "__main__":',
        "    for line in sys.stdin:",
        "        if line.strip():",
        "            example = json.loads(line)",
        ('            print(json.dumps({**example, "labels": labels(example)}))' if task.multi_label else
         '            print(json.dumps({**example, "label": label(example)}))'),
    ]
    return "\n".join(lines) + "\n"
