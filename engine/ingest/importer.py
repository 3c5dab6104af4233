"""Importing user data into a workspace: options, row validation and normalisation, the import itself.

Files are read by `readers.py`, splits and audit rows are drawn by `splits.py`, and the error types
(`IngestError`, `RowProblem`) live in `errors.py`; this module ties them together.

Every rejection names the row and the reason. By default a file with any bad row imports nothing
(`IngestError` lists every problem); with `skip_bad_rows=True` the good rows are imported and the
bad ones are reported. Splits: `pool` (unlabeled work), `dev` (labeled fitness set) and `test`
(holdout, only ever read by `evopool eval`).

Multi-label tasks (`multi_label=True`): a label cell holds several labels, joined by `label_separator`
(CSV / TSV) or as a JSON list (JSONL). The row's first label is kept as its `label` (stratified draws and
the agents read it); all of them as its `label_set`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.domain import Task
from engine.ingest.columns import choose_text_column
from engine.ingest.errors import IngestError, RowProblem
from engine.ingest.readers import ROW_PLACES, ROW_POSITIONS, read_rows, read_wrench_rows
from engine.ingest.splits import assign_splits, mark_audit, no_dev_reason, to_draw
from engine.ingest.variants import variant_problems
from engine.store.workspace import Store

FIRST_PROBLEMS = 5  # told when no row could be read: the rest are most often the same
SPLIT_ALIASES = {
    "pool": "pool", "train": "pool", "unlabeled": "pool", "unlabelled": "pool",
    "dev": "dev", "valid": "dev", "validation": "dev", "val": "dev",
    "test": "test", "holdout": "test",
}


@dataclass(frozen=True)
class IngestOptions:
    text_column: str | None = None  # None: chosen by content (engine/ingest/columns.py)
    label_column: str | None = "label"  # None: no labels in the file; a column the file lacks is refused
    split_column: str | None = "split"
    id_column: str | None = "id"
    field_columns: tuple[str, ...] | None = None  # None: every other column is kept as a field
    labels: tuple[str, ...] | None = None  # None: the labels found in the data (sorted)
    label_descriptions: dict[str, str] = field(default_factory=dict)
    instructions: str = ""
    task_name: str | None = None
    dev_size: int = 500
    audit_fraction: float = 0.2  # share of each class's dev rows held back from the agents and the gate
    seed: int = 0
    skip_bad_rows: bool = False
    multi_label: bool = False  # a label cell may hold several labels
    label_separator: str = "|"  # between the labels of a multi-label CSV / TSV cell


@dataclass(frozen=True)
class ImportReport:
    dataset: str
    n_rows: int
    split_counts: dict[str, int]
    labels: tuple[str, ...]
    skipped: tuple[RowProblem, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImportPlan:
    """An import worked out but not written: the rows it would write (with splits and audit marks)."""

    rows: pd.DataFrame
    labels: tuple[str, ...]
    problems: list[RowProblem]
    notes: list[str]
    text_column: str

    def split_counts(self) -> dict[str, int]:
        if self.rows.empty:
            return {}
        counts = self.rows["split"].value_counts().to_dict()
        counts["audit"] = int(self.rows["audit"].sum())
        return {k: int(v) for k, v in sorted(counts.items())}


def with_text_column(frame: pd.DataFrame, opts: IngestOptions) -> IngestOptions:
    """`opts` with its text column named: as given, else chosen by content (refused when no column reads as text)."""
    if opts.text_column is not None:
        return opts
    chosen = choose_text_column(frame)
    if chosen is None:
        raise IngestError("no column holds free text (cells of several words); the columns are: "
                          f"{', '.join(map(str, frame.columns))}; name the text column")
    return IngestOptions(**{**opts.__dict__, "text_column": chosen})


# ---- validating ----------------------------------------------------------------------------------
def _no_label_column(name: str, columns: list[str]) -> str:
    """Why a label column asked for (or expected as `label`) is refused: not in the file, which has these columns."""
    alike = [c for c in columns if c.casefold() == name.casefold()]
    hint = f"; column names are case-sensitive: is it {alike[0]!r}?" if alike else ""
    return (f"no label column {name!r} in the file (its columns: {', '.join(map(repr, columns))}{hint}); "
            "name the column that holds the labels")


def row_positions(frame: pd.DataFrame) -> pd.Index:
    """Each row's 0-based place among the file's data rows (a reader that dropped unreadable rows kept them in the
    index); `RowProblem.row` is this plus one."""
    return frame.index if frame.attrs.get(ROW_POSITIONS) else pd.RangeIndex(len(frame))


def cell_text(value) -> str:
    """An id, split or label cell as the text the user wrote ("" when blank).

    A missing value (None, NaN, pd.NA) is blank, not "nan"; an integral float is shown as its int: a JSONL or
    Parquet column of ints with one missing value reads as floats, and its 1 must stay "1", not "1.0"."""
    if pd.api.types.is_scalar(value) and pd.isna(value):
        return ""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _label_of(value) -> str | None:
    """A cell's label name as written, or None when blank. A digit is a name, never an index into the label set:
    with labels "1" and "5" (stars), or "-1" and "1" (stance), an index would file a row under another label."""
    return cell_text(value) or None


def _label_names(value, opts: IngestOptions) -> list[str] | None:
    """A cell's label names (one, or several for a multi-label task, duplicates dropped); None when blank."""
    if not opts.multi_label:
        name = _label_of(value)
        return None if name is None else [name]
    if isinstance(value, np.ndarray):  # Parquet list cells
        value = value.tolist()
    if isinstance(value, (list, tuple)):  # JSONL list cells
        parts = list(value)
    elif _label_of(value) is None:
        return None
    else:
        parts = str(value).split(opts.label_separator)
    names = [name for name in map(_label_of, parts) if name is not None]
    return list(dict.fromkeys(names)) or None


def _unknown(names: list[str], labels: tuple[str, ...]) -> str | None:
    """Why a cell's labels are refused, or None when every one is in the label set."""
    bad = [n for n in names if n not in labels]
    if not bad:
        return None
    if len(bad) == 1:
        return f"label {bad[0]!r} is not in the label set ({', '.join(labels)})"
    return f"labels {', '.join(map(repr, bad))} are not in the label set ({', '.join(labels)})"


def validate(frame: pd.DataFrame, opts: IngestOptions, labels: tuple[str, ...] | None = None
             ) -> tuple[pd.DataFrame, tuple[str, ...], list[RowProblem]]:
    """Check and normalise a raw frame. Returns (clean frame, label names, problems).

    A problem's row is the row of the file: the frame's index where a reader set it to the row positions, else
    the row's place in the frame."""
    opts = with_text_column(frame, opts)
    if opts.text_column not in frame.columns:
        raise IngestError(f"no text column {opts.text_column!r}; the columns are: {', '.join(map(str, frame.columns))}")
    if opts.label_column is not None and opts.label_column not in frame.columns:
        raise IngestError(_no_label_column(opts.label_column, [str(c) for c in frame.columns]))
    labels = tuple(opts.labels) if opts.labels else labels
    has_labels = opts.label_column is not None
    has_split = opts.split_column is not None and opts.split_column in frame.columns
    has_id = opts.id_column is not None and opts.id_column in frame.columns
    reserved = {opts.text_column, opts.label_column, opts.split_column, opts.id_column}
    field_cols = [c for c in (opts.field_columns if opts.field_columns is not None else frame.columns)
                  if c not in reserved]
    missing = [c for c in field_cols if c not in frame.columns]
    if missing:
        raise IngestError(f"field column(s) not in the file: {', '.join(missing)}")

    if opts.multi_label and not opts.label_separator:
        raise IngestError("a multi-label import needs a label separator (e.g. '|')")
    raw_labels = ([_label_names(v, opts) for v in frame[opts.label_column]] if has_labels
                  else [None] * len(frame))
    positions = row_positions(frame)
    places = frame.attrs.get(ROW_PLACES, {})  # a WRENCH row is named by its file and record, not "row N"
    problems: list[RowProblem] = []
    if labels is None:  # read from the data: 'None' beside 'none' is a typo far more often than two classes
        labels = tuple(sorted({lab for names in raw_labels if names for lab in names}))
        problems += variant_problems(raw_labels, lambda i: places.get(positions[i]) or f"row {positions[i] + 1}")
    seen_ids: dict[str, int] = {}
    keep: list[int] = []
    out: dict[str, list[Any]] = {"id": [], "text": [], "label": [], "label_set": [], "split": [], "fields": []}
    # each column as a list once (the cells boxed as `.iloc` boxes them): a pandas lookup per cell cost
    # ~0.1 ms, a minute at 100K rows
    texts = list(frame[opts.text_column].array)
    row_ids = list(frame[opts.id_column].array) if has_id else None
    cells = list(frame[opts.split_column].array) if has_split else None
    field_values = {c: list(frame[c].array) for c in field_cols}
    for i in range(len(frame)):
        row_no = int(positions[i]) + 1
        where = places.get(positions[i], "")
        text = texts[i]
        if _missing(text) or not str(text).strip():  # pd.NA too: a Parquet string column's gap is no "<NA>"
            problems.append(RowProblem(row_no, f"empty text in column {opts.text_column!r}", where))
            continue
        row_id = cell_text(row_ids[i]) if row_ids is not None else str(row_no)
        if not row_id:
            problems.append(RowProblem(row_no, "empty id", where))
            continue
        if row_id in seen_ids:
            problems.append(RowProblem(row_no, f"duplicate id {row_id!r} (first seen on row {seen_ids[row_id]})",
                                       where))
            continue
        names = raw_labels[i]
        label = names[0] if names else None
        refused = _unknown(names, labels) if names else None
        if refused:
            problems.append(RowProblem(row_no, refused, where))
            continue
        split = None
        if cells is not None:  # has_split
            cell = cell_text(cells[i]).lower()
            split = SPLIT_ALIASES.get(cell) if cell else None
            if cell and split is None:
                problems.append(RowProblem(row_no, f"unknown split {cell!r} (use pool, dev or test)", where))
                continue
        if split in ("dev", "test") and label is None:
            problems.append(RowProblem(row_no, f"a {split} row needs a label", where))
            continue
        seen_ids[row_id] = row_no
        keep.append(i)
        out["id"].append(row_id)
        out["text"].append(str(text))
        out["label"].append(labels.index(label) if label is not None else None)
        out["label_set"].append(sorted(labels.index(n) for n in names) if opts.multi_label and names else None)
        out["split"].append(split)
        out["fields"].append({c: _plain(values[i]) for c, values in field_values.items()})
    if len(labels) < 2 and keep:
        problems.append(RowProblem(0, f"need at least two labels, found {list(labels)}: give a label set"))
    return pd.DataFrame(out), labels, problems


def _missing(value) -> bool:
    """None, NaN, pd.NA or NaT (a list or dict cell is never missing)."""
    return pd.api.types.is_scalar(value) and bool(pd.isna(value))


def _plain(value):
    """A field value as JSON-able plain Python (numpy arrays and scalars become lists / numbers, a gap None)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()  # a float64 NaN is still NaN: checked below
    return None if _missing(value) else value


# ---- importing -----------------------------------------------------------------------------------
def no_rows_reason(frame: pd.DataFrame) -> str:
    """Why a file with a header and no row under it (or nothing at all) imports nothing."""
    columns = ", ".join(map(str, frame.columns))
    return (f"the file has no rows under its header (columns: {columns}); nothing was imported" if columns
            else "the file is empty; nothing was imported")


EXPORT_LABELS = "gold_label"  # an export's own gold: the expert's dev labels (test rows keep theirs out of the file)


def model_columns(columns) -> list[str] | None:
    """The columns a model wrote into an EvoPool file (a workspace export or an `evopool label` shard, both by
    `engine.export.files.add_label_columns`): label or labels, confidence, a p_<class> per class (between confidence and
    n_votes, in the task's label order), n_votes, aggregator. None for a file of any other kind."""
    names = [str(c) for c in columns]
    if not {"confidence", "n_votes", "aggregator"} <= set(names) or not {"label", "labels"} & set(names):
        return None
    first, last = names.index("confidence"), names.index("n_votes")
    probabilities = names[first + 1:last]
    if len(probabilities) < 2 or not all(c.startswith("p_") for c in probabilities):
        return None
    return [c for c in ("label", "labels") if c in names] + ["confidence", *probabilities, "n_votes", "aggregator"]


def model_classes(columns) -> tuple[str, ...]:
    """The classes of an EvoPool file, in the task's order: its p_<class> columns (none for another file)."""
    return tuple(c[2:] for c in model_columns(columns) or () if c.startswith("p_"))


def is_export(columns) -> bool:
    """Whether a file is an EvoPool workspace export: a model's columns and the expert's `gold_label`."""
    return model_columns(columns) is not None and EXPORT_LABELS in {str(c) for c in columns}


def _from_an_export(frame: pd.DataFrame, opts: IngestOptions) -> tuple[pd.DataFrame, IngestOptions, list[str]]:
    """An EvoPool file read back as data: never labeled from the model's `label` (its predictions became gold, test
    rows' too, and its p_* columns were fields an annotator could read: a review), the model's columns left out,
    the classes (and their order) those of its p_* columns; an export's test rows, whose gold it keeps out, join the
    pool. Any other file as is."""
    made = model_columns(frame.columns)
    if made is None:
        return frame, opts, []
    gold = EXPORT_LABELS in frame.columns
    if opts.label_column in ("label", "labels"):
        raise IngestError(f"this file was written by EvoPool: its {opts.label_column!r} column holds a model's "
                          "labels, not gold. " + (
                              f"Label from its {EXPORT_LABELS!r} column (the expert's dev labels): --label-column "
                              f"{EXPORT_LABELS}, or the import form's Label column" if gold else
                              "It holds no gold labels (`evopool label` output): import the data it was made from, "
                              "or, where that data had its own label column (written as `field_label`), name that "
                              "one as the label column"))
    classes = model_classes(made)
    frame = frame.drop(columns=made)
    changes: dict = {"labels": opts.labels or classes}
    if opts.field_columns is not None:
        changes["field_columns"] = [c for c in opts.field_columns if c not in made]
    opts = IngestOptions(**{**opts.__dict__, **changes})
    notes = [f"written by EvoPool: the model's columns ({', '.join(made)}) are left out"
             + (f"; labeled from {EXPORT_LABELS!r}" if gold and opts.label_column == EXPORT_LABELS else "")]
    split = opts.split_column
    if gold and split is not None and split in frame:
        held = (frame[split].map(cell_text).str.lower() == "test") & (frame[EXPORT_LABELS].map(cell_text) == "")
        if held.any():
            frame = frame.copy()
            frame.loc[held, split] = "pool"
            notes.append(f"its {int(held.sum()):,} test rows carry no gold (an export keeps holdout labels out), so "
                         "they join the unlabeled pool")
    return frame, opts, notes


def plan_import(frame: pd.DataFrame, opts: IngestOptions, labels: tuple[str, ...] | None = None,
                read_problems: list[RowProblem] | tuple[RowProblem, ...] = ()) -> ImportPlan:
    """What an import would do, without writing anything: the clean rows with their splits, every problem,
    and notes for the user (the dev split smaller than asked, no unlabeled rows, the text column chosen)."""
    if read_problems and frame.empty:  # their cause (str(dict) lines, a ';' file), not "no column holds free text"
        header = (f" (its header names {len(frame.columns)} column(s): {', '.join(map(repr, frame.columns))})"
                  if len(frame.columns) else "")
        first = sorted(read_problems, key=lambda p: p.row)[:FIRST_PROBLEMS]
        raise IngestError(f"none of the file's {len(read_problems):,} rows could be read, so there is nothing to "
                          f"import{header}; why, for the first {len(first)}", first)
    if len(frame) == 0:  # a header and nothing under it: say so, not "no usable rows" or "no column holds free text"
        raise IngestError(no_rows_reason(frame))
    frame, opts, export_notes = _from_an_export(frame, opts)
    resolved = with_text_column(frame, opts)  # chosen once, here, when the caller named none
    text_column = resolved.text_column
    assert text_column is not None  # with_text_column names one or refuses
    for role, column in (("id", opts.id_column), ("label", opts.label_column), ("split", opts.split_column)):
        if column is not None and column == text_column:  # the form's fallback when no column reads like text
            raise IngestError(f"the text column {text_column!r} is also the {role} column: the annotators would "
                              f"read each row's {role} as its text; choose the column that holds the text")
    clean, labels, problems = validate(frame, resolved, labels)
    problems = sorted([*read_problems, *problems], key=lambda p: p.row)
    notes: list[str] = list(export_notes)
    if opts.text_column is None and text_column.lower() != "text":
        notes.append(f"the text is read from column {text_column!r} (the longest free text); choose another "
                     "text column if that is wrong")
    if clean.empty:
        return ImportPlan(clean, labels, problems, notes, text_column)
    labeled = int(clean["label"].notna().sum())
    unsplit = clean
    clean, split_notes = assign_splits(clean, opts.dev_size, opts.seed)
    if not (clean["split"] == "dev").any():  # a problem of the whole file: no import without a dev split
        problems = [RowProblem(0, no_dev_reason(unsplit, opts.dev_size)), *problems]
    clean["audit"], audit_notes = mark_audit(clean, opts.audit_fraction, opts.seed)
    notes += split_notes + audit_notes
    n_dev = int((clean["split"] == "dev").sum())
    drawn = bool(to_draw(unsplit).any())  # else the file's own splits decide
    if drawn and 0 < n_dev < opts.dev_size and labeled <= opts.dev_size:
        notes.append(f"dev takes all {n_dev} usable labeled rows (the dev size is {opts.dev_size}): none is left "
                     "for a test (holdout) split; the audit rows, where there are enough, keep the figures honest")
    if not (clean["split"] == "pool").any():
        notes.append("no unlabeled rows: the pool has nothing to label yet (every row has a label); "
                     "the pool still learns from dev, and you can label new data with it later")
    return ImportPlan(clean, labels, problems, notes, text_column)


def import_frame(store: Store, frame: pd.DataFrame, opts: IngestOptions, *, dataset: str, source: str,
                 labels: tuple[str, ...] | None = None,
                 read_problems: list[RowProblem] | tuple[RowProblem, ...] = (),
                 on_stage: Callable[[float, str], None] | None = None) -> ImportReport:
    """Validate, draw splits and write the rows; a refused import writes nothing. `on_stage(share done, what)`
    is told as each stage starts (the studio's progress bar)."""
    if store.has_data():
        raise IngestError(f"workspace {store.path.parent} already holds data; use a new workspace")
    if len(frame) == 0 and not read_problems:
        raise IngestError(f"{source}: {no_rows_reason(frame)}")
    stage = on_stage or (lambda share, what: None)
    stage(0.2, f"checking {len(frame):,} rows")
    plan = plan_import(frame, opts, labels, read_problems)
    clean, labels, problems = plan.rows, plan.labels, plan.problems
    fatal = [p for p in problems if p.row == 0]
    if fatal or (problems and not opts.skip_bad_rows):
        raise IngestError(f"{source}: {len(problems)} problem(s); nothing was imported", problems)
    if clean.empty:
        raise IngestError(f"{source}: no usable rows")
    notes = list(plan.notes)
    stray = sorted(set(opts.label_descriptions) - set(labels))
    if stray:
        notes.append(f"descriptions given for labels the data does not have (ignored): {', '.join(stray)}")
    field_names = tuple(sorted({k for f in clean["fields"] for k in f}))
    described = {label: text for label, text in opts.label_descriptions.items() if label in labels}
    task = Task(name=opts.task_name or dataset, labels=labels, label_descriptions=described,
                instructions=opts.instructions, fields=field_names, multi_label=opts.multi_label)
    # the rows last, in one transaction: until they land the workspace holds no data, so an import cut short
    # (Ctrl-C, a kill) can simply be run again; rows without a task had left a workspace no command could open
    stage(0.6, f"writing {len(clean):,} rows")
    store.save_task(task)
    store.set_meta("ingest", {"dev_size": opts.dev_size, "audit_fraction": opts.audit_fraction, "seed": opts.seed,
                              "source": source, "multi_label": opts.multi_label,
                              "label_separator": opts.label_separator})
    store.add_examples(dataset, source, clean)
    return ImportReport(dataset, len(clean), store.split_counts(), labels, tuple(problems), tuple(notes))


def import_path(store: Store, path: str | Path, opts: IngestOptions = IngestOptions(),
                on_stage: Callable[[float, str], None] | None = None) -> ImportReport:
    """Import a CSV / JSONL / Parquet file or a WRENCH folder into an empty workspace (`on_stage`: as
    `import_frame`)."""
    path = Path(path)
    if not path.exists():
        raise IngestError(f"{path} does not exist")
    if path.is_dir():
        frame, labels, read_problems = read_wrench_rows(path)
        opts = IngestOptions(**{**opts.__dict__, "id_column": "id", "label_column": "label",
                                "split_column": "split", "text_column": "text"})
        return import_frame(store, frame, opts, dataset=path.name, source=str(path), labels=labels,
                            read_problems=read_problems, on_stage=on_stage)
    frame, read_problems = read_rows(path)
    return import_frame(store, frame, opts, dataset=path.stem, source=str(path), read_problems=read_problems,
                        on_stage=on_stage)
