"""Files out: the labeled dataset (with soft labels and provenance), a manifest, and the pool as a .py file.

A multi-label export has a `labels` column (every class predicted for the row, joined by the import's
label separator) where a single-label export has `label`.
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from engine.atomic import write_atomically
from engine.domain import ABSTAIN, UNDO, SoftLabels, restored_by_undo
from engine.sandbox.checks import ALLOWED_BUILTINS, ALLOWED_IMPORTS
from engine.store.workspace import Store

FORMATS = ("csv", "jsonl", "parquet")  # one file each
EXPORT_FORMATS = (*FORMATS, "hf")  # hf: a Hugging Face DatasetDict folder (engine/export/hf.py)
# what a spreadsheet reads as the start of a formula (OWASP, "CSV injection"): a comment that begins "=HYPERLINK("
# runs when the CSV is opened in Excel or LibreOffice
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


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
    ours = {*out.columns, *output_columns(task.labels)}
    taken = ours | set(task.fields)
    for name in task.fields:
        out[field_column(name, ours, taken)] = [field_cell(f.get(name)) for f in frame["fields"]]
    add_label_columns(out, task.labels, probs, hard, n_votes, soft.aggregator, label_separator(store))
    out["gold_label"] = dev_gold(store, frame, task.labels, task.multi_label)
    return out


def output_columns(labels: tuple[str, ...]) -> set[str]:
    """The columns an export writes besides id, text and split (both `label` and `labels`: a field is renamed
    alike on a single- and a multi-label task)."""
    return {"label", "labels", "confidence", "n_votes", "aggregator", "gold_label", *map(probability_column, labels)}


def field_column(name: str, ours: set[str], taken: set[str]) -> str:
    """A field's column in the export: its own name, or `field_<name>` where one of `ours` (the export's own
    columns) has that name: a `confidence` column of the input was overwritten by ours without a word. `taken`
    holds every column name in use and gets the one returned."""
    column = name
    while column in ours or (column != name and column in taken):
        column = f"field_{column}"
    taken.add(column)
    return column


def field_cell(value):
    """A field as a file cell: lists and dicts as JSON, anything else as it is. A list of plain ints (an entity
    span) is written directly, as json.dumps would: 200K spans at 100K rows took 0.7 s through json."""
    if isinstance(value, list) and all(type(v) is int for v in value):
        return "[" + ", ".join(map(str, value)) + "]"
    return json.dumps(value) if isinstance(value, (list, dict)) else value


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


def verdict_record(store: Store, pool_ids: Sequence[str] | None = None) -> dict:
    """For the manifest: why each pool member is there (the deciding verdict and its reasons), and every
    override the expert made against the gate, with the reason they typed. `pool_ids`: that pool's members
    (default: the pool now)."""
    verdicts = store.verdicts()
    pool = set(store.pool_ids() if pool_ids is None else pool_ids)
    latest = verdicts.groupby("annotator_id").tail(1) if not verdicts.empty else verdicts
    members = {row.annotator_id: {"verdict": row.verdict, "decided_by": row.decided_by,
                                  "reasons": list(row.reasons), "note": row.note or ""}
               for row in latest.itertuples() if row.annotator_id in pool}
    human = verdicts[verdicts["decided_by"].isin(["human", UNDO])] if not verdicts.empty else verdicts
    overrides = [{"annotator_id": row.annotator_id, "generation": int(row.generation),
                  "verdict": f"undone ({row.verdict} restored)" if restored_by_undo(row.reasons) else row.verdict,
                  "note": row.note or "", "recorded_at": str(row.recorded_at)[:19]}
                 for row in human.itertuples()]
    return {"pool_verdicts": members, "expert_overrides": overrides}


def add_label_columns(out: pd.DataFrame, labels: tuple[str, ...], probs: np.ndarray, hard: np.ndarray,
                      n_votes: np.ndarray, made_by: str, separator: str) -> None:
    """The columns every labeled file shares (workspace export and corpus shards alike): the hard label (or the
    multi-label set joined by `separator`), its confidence, a probability per class, the votes, the aggregator."""
    if hard.ndim == 2:
        out["labels"] = [separator.join(labels[c] for c in np.flatnonzero(row)) for row in hard]
    else:
        out["label"] = [labels[h] if h != ABSTAIN else "" for h in hard]
    out["confidence"] = confidence(probs, hard).round(6)
    for k, label in enumerate(labels):
        out[probability_column(label)] = probs[:, k].round(6)
    out["n_votes"] = n_votes
    out["aggregator"] = made_by


def spreadsheet_safe(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The frame with every text cell a spreadsheet would run as a formula (it starts with one of FORMULA_START)
    behind a leading apostrophe, which spreadsheets show as text, and how many cells were so quoted. The cells then
    differ from the data by that apostrophe, so it is a choice for a CSV meant to be opened, not trained on."""
    out, quoted = frame.copy(), 0
    for column in out.columns:
        cells = out[column]
        if cells.dtype != object and not pd.api.types.is_string_dtype(cells.dtype):
            continue  # numbers, booleans, times: a spreadsheet reads them as values
        risky = cells.map(lambda v: isinstance(v, str) and v.startswith(FORMULA_START)).to_numpy(dtype=bool)
        if risky.any():
            out[column] = cells.where(~risky, "'" + cells[risky].astype(str))
            quoted += int(risky.sum())
    return out, quoted


def frame_bytes(frame: pd.DataFrame, fmt: str, spreadsheet: bool = False) -> bytes:
    """The labeled frame as the bytes of a CSV, JSONL or Parquet file (for a download button or a file).
    `spreadsheet`: a CSV safe to open in a spreadsheet (`spreadsheet_safe`)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if spreadsheet and fmt != "csv":
        raise ValueError(f"only a CSV is made safe for spreadsheets, not {fmt!r}")
    buffer = io.BytesIO()
    if fmt == "csv":
        (spreadsheet_safe(frame)[0] if spreadsheet else frame).to_csv(buffer, index=False)
    elif fmt == "jsonl":
        frame.to_json(buffer, orient="records", lines=True, force_ascii=False)
    else:
        from engine.export.hf import arrow_safe  # pyarrow's half of the export; `datasets` is not imported

        arrow_safe(frame).to_parquet(buffer, index=False)
    return buffer.getvalue()


def file_format(out: str | Path, fmt: str | None = None) -> str:
    """The format a file is written in: `fmt` when given, else `out`'s suffix, else csv."""
    return (fmt or Path(out).suffix.lstrip(".") or "csv").lower()


POOL_HEADER = "EvoPool annotator pool"  # the first words of `pool_as_python`'s file


def manifest_path(path: Path) -> Path:
    """Where an export's manifest sits: beside it, `<file>.manifest.json`."""
    return path.with_name(path.name + ".manifest.json")


def _refuse_workspace_file(store: Store, path: Path) -> None:
    """A file of the workspace's own (its database and what DuckDB keeps beside it) is no place to write to: an
    export once overwrote the database."""
    target = path.resolve()
    if target.parent == store.path.parent.resolve() and target.name.startswith(store.path.name):
        raise ValueError(f"{path} is the workspace's own database: write somewhere else")


def check_destination(store: Store, out: str | Path, fmt: str | None = None) -> str:
    """The export's format, once `out` is a safe place for it, checked before any work is done: a known format,
    not a file of the workspace's own, and no existing file but an earlier export (its manifest beside it); a
    ValueError naming the path otherwise."""
    out = Path(out)
    _refuse_workspace_file(store, out)
    target = out.resolve()
    if target.is_file() and not manifest_path(target).is_file():
        raise ValueError(f"{out} exists and is not an earlier export (no {target.name}.manifest.json beside it): "
                         "choose another path, or move that file away first")
    chosen = file_format(out, fmt)
    if chosen not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {chosen!r} (from {out.name!r}): use --format, one of "
                         f"{', '.join(EXPORT_FORMATS)}, or a file name ending in one")
    return chosen


def write_frame(frame: pd.DataFrame, out: str | Path, fmt: str | None = None, spreadsheet: bool = False) -> Path:
    out = Path(out)
    data = frame_bytes(frame, file_format(out, fmt), spreadsheet)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, data)
    return out


def manifest(store: Store, soft: SoftLabels, frame: pd.DataFrame, extra: dict | None = None,
             threshold: float | None = None, pool_ids: Sequence[str] | None = None) -> dict:
    """Provenance of an export: which pool, which aggregator, when, and how many rows per split.

    `pool_ids`: the pool that made the labels, when that is not the pool now (the studio's saved labels); the
    manifest then also says whether the pool has changed since (`pool_changed_since`). A multi-label export also
    records `multi_label: true`, the threshold and the label separator.
    """
    pool = store.pool_ids() if pool_ids is None else list(pool_ids)
    changed = {} if pool_ids is None else {"pool_changed_since": sorted(pool) != sorted(store.pool_ids())}
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
        **changed,
        **verdict_record(store, pool),
        **(extra or {}),
    }


def write_export(store: Store, soft: SoftLabels, hard: np.ndarray, n_votes: np.ndarray, out: str | Path,
                 fmt: str | None = None, extra: dict | None = None,
                 threshold: float | None = None, spreadsheet: bool = False) -> tuple[Path, Path]:
    """Write the labeled dataset and a `<file>.manifest.json` beside it (threshold: multi-label only).

    fmt "hf" writes a folder in the Hugging Face `datasets` layout (needs the `hf` extra). `spreadsheet`: a CSV
    safe to open in a spreadsheet (`spreadsheet_safe`; the manifest counts the cells quoted)."""
    check_destination(store, out, fmt)
    frame = labeled_frame(store, soft, hard, n_votes)
    written = frame
    if spreadsheet:  # quoted once: the file gets the quoted frame, the manifest its count
        written, quoted = spreadsheet_safe(frame)
        extra = {**(extra or {}), "spreadsheet_safe": {"quoted_cells": quoted}}
    if fmt == "hf":
        from engine.export.hf import write_hf

        path = write_hf(frame, store.load_task().labels, out, label_separator(store))
    else:
        path = write_frame(written, out, fmt)
    written_manifest = manifest_path(path)
    manifest_text = json.dumps(manifest(store, soft, frame, extra, threshold), indent=2)
    write_atomically(written_manifest, manifest_text.encode("utf-8"))
    return path, written_manifest


def check_pool_destination(store: Store, path: Path, out: Path) -> None:
    """The pool's .py goes where nothing of the workspace's, nor the export `out` or its manifest, nor a file but an
    earlier exported pool is; a ValueError naming the path otherwise."""
    target, export = path.resolve(), Path(out).resolve()
    if target in (export, manifest_path(export)):
        raise ValueError(f"--pool-python {path} is the export's own file or its manifest: give each its own path")
    _refuse_workspace_file(store, path)
    if target.is_file() and POOL_HEADER not in target.read_text(errors="replace")[:200]:
        raise ValueError(f"{path} exists and is not an exported pool: choose another path, or move it away first")


def pool_as_python(store: Store) -> str:
    """The current pool as one runnable module: each annotator, majority-vote `label(example)` and the
    multi-label `labels(example)` (every label voted); run as a script it writes the one the task uses.

    The annotators are code someone else wrote, so the module runs them in EvoPool's sandbox
    (engine.sandbox.executor: confined worker processes) when the engine is installed; without it, it refuses
    unless the user passes --unsandboxed, and then runs them with the checker's restricted builtins, which the
    header says is no security boundary. Each source is kept verbatim in its own namespace.
    """
    task = store.load_task()
    annotators = store.annotators(store.pool_ids())
    lines = [
        f'"""{POOL_HEADER} for the task named in TASK: {len(annotators)} annotators.',
        "",
        "Exported by EvoPool Studio. Usage: python this_file.py < examples.jsonl > labels.jsonl",
        "The labels it writes are the pool's majority vote (every label voted, on a multi-label task), not the",
        "studio's soft labels, which an aggregator fitted on dev makes from these votes and the text; and it is the",
        "pool as it stood when exported, which may differ from the pool that made a labels download.",
        '(each input line a JSON object with "text" and the task\'s fields).',
        "",
        "THIS FILE RUNS CODE: each annotator below is Python that an LLM or a person wrote. With EvoPool installed",
        "(`pip install evopool-studio`, which provides the `engine` package) every annotator runs in EvoPool's",
        "sandbox: confined worker processes with no file, network or process access (`evopool doctor` shows each",
        "layer on this machine). Without EvoPool the script refuses to run; `--unsandboxed` runs the annotators in",
        "this process with restricted builtins only, which is NOT a security boundary: read the code first.",
        '"""',
        "import builtins",
        "import json",
        "import sys",
        "from collections import Counter",
        "",
        f"TASK = {task.name!r}",
        f"LABELS = {list(task.labels)!r}",
        "SOURCES = {}",
        "",
    ]
    for a in annotators:
        # names, task names and labels come from data, an LLM or a person: only ever written as literals (a name's
        # newline in a comment, or a task name's triple quote in the docstring, once ran as code when the file loaded)
        about = (f"{a.name} — {a.agent}, generation {a.generation}, author {a.author}, written by {a.provenance}, "
                 f"id {a.id}")
        lines.append(f"# {about!r}")
        lines.append(f"SOURCES[{a.id!r}] = {a.source!r}")
        lines.append("")
    # the checker's own lists, so what runs in the sandbox runs here (`object` was missing: every template failed)
    lines += (_POOL_RUNNER.replace("{safe_builtins}", repr(tuple(sorted(ALLOWED_BUILTINS - {"print"}))))
              .replace("{imports}", repr(tuple(sorted(ALLOWED_IMPORTS))))).splitlines()
    lines += [
        "",
        'if __name__ == "__main__":',
        "    unsandboxed = '--unsandboxed' in sys.argv[1:]",
        "    rows = [json.loads(line) for line in sys.stdin if line.strip()]",
        "    for example, row_votes in zip(rows, votes_all(rows, unsandboxed), strict=True):",
        ('        print(json.dumps({**example, "labels": label_set(row_votes)}))' if task.multi_label else
         '        print(json.dumps({**example, "label": majority(row_votes)}))'),
    ]
    return "\n".join(lines) + "\n"


_POOL_RUNNER = '''
_SAFE_BUILTINS = {safe_builtins}
_IMPORTS = {imports}


def _import(name, globals_=None, locals_=None, fromlist=(), level=0):
    if level or name.split(".")[0] not in _IMPORTS:
        raise ImportError(f"import of {name!r} is not allowed")
    return builtins.__import__(name, globals_, locals_, fromlist, 0)


_FOLDED = Counter(_label.casefold() for _label in LABELS)


def _as_label(out):
    """A vote as EvoPool's sandbox reads it: a label, or the one label it names ignoring case and spaces."""
    if type(out) is not str:
        return None
    if out in LABELS:
        return out
    named = [lab for lab in LABELS if lab.casefold() == out.strip().casefold()]
    return named[0] if len(named) == 1 and _FOLDED[named[0].casefold()] == 1 else None


def _unsandboxed_votes(rows):
    """In this process, restricted builtins only: NOT a security boundary (see the header)."""
    # the names of the exporting Python: one that runs the file may lack some (3.10 has no BaseExceptionGroup)
    table = {name: getattr(builtins, name) for name in _SAFE_BUILTINS if hasattr(builtins, name)}
    table["__import__"] = _import
    table["print"] = lambda *args, **kwargs: None  # stdout carries the labels
    functions = {}
    for _id, source in SOURCES.items():
        namespace = {"__builtins__": dict(table), "__name__": "annotator"}
        exec(compile(source, _id, "exec"), namespace)  # noqa: S102 - only with --unsandboxed
        functions[_id] = namespace["annotate"]
    out = []
    for example in rows:
        row = {}
        for _id, fn in functions.items():
            try:
                row[_id] = _as_label(fn(dict(example)))
            except Exception:
                row[_id] = None
        out.append(row)
    return out


def votes_all(rows, unsandboxed=False):
    """Each annotator's vote (a label name or None) on each row, run in EvoPool's sandbox."""
    try:
        from engine.domain import Annotator
        from engine.sandbox.executor import SandboxExecutor
    except ImportError:
        if not unsandboxed:
            sys.exit("EvoPool is not installed, so there is no sandbox to run these annotators in; install it "
                     "(pip install evopool-studio) or pass --unsandboxed after reading the code (see the header)")
        return _unsandboxed_votes(rows)
    try:  # unedited template annotators run compiled (no code of theirs runs), the rest in the sandbox
        from engine.apply.executor import CompiledExecutor as Executor
    except ImportError:  # an EvoPool older than engine/apply/ (its compiled path lived elsewhere): all sandboxed
        Executor = SandboxExecutor
    pool = [Annotator(id=_id, name=_id, source=source, agent="export", generation=0)
            for _id, source in SOURCES.items()]
    with Executor() as executor:
        results = executor.run(pool, rows, LABELS)
    return [{r.annotator_id: (LABELS[r.votes[i]] if r.votes[i] >= 0 else None) for r in results}
            for i in range(len(rows))]


def votes(example):
    """Each annotator's vote on one example (one sandbox run; use votes_all for many)."""
    return votes_all([example])[0]


def majority(row_votes):
    """Majority vote; ties go to the label listed first; None when all abstain."""
    counts = Counter(v for v in row_votes.values() if v in LABELS)
    if not counts:
        return None
    best = max(counts.values())
    return next(lab for lab in LABELS if counts.get(lab) == best)


def label_set(row_votes):
    """Multi-label: every label some annotator voted, in label-set order (the rule the gate scores)."""
    voted = set(row_votes.values())
    return [lab for lab in LABELS if lab in voted]


def label(example):
    return majority(votes(example))


def labels(example):
    return label_set(votes(example))
'''
