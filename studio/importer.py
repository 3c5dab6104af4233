"""The import form: read an upload or a path, preview it, map its columns, import it (or explain why not)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from engine.ingest.columns import choose_text_column
from engine.ingest.errors import IngestError, RowProblem
from engine.ingest.importer import (
    EXPORT_LABELS,
    ImportReport,
    IngestOptions,
    cell_text,
    is_export,
    model_classes,
    model_columns,
    plan_import,
    row_positions,
)
from engine.ingest.readers import read_rows, read_wrench_rows
from engine.jobs import REGISTRY, start_embed, start_import
from engine.markdown import escape_md
from engine.store.workspace import Store
from studio import state, widgets, workspace
from studio.refresh import AppRefresh, poll_job

NONE = "(none)"


PLAN_MAX_ROWS = 20_000  # above this, working out the import waits for a click (it validates every row)


@st.cache_data(show_spinner="Reading the file…", max_entries=4)
def read_upload(raw: bytes, name: str) -> tuple[pd.DataFrame, list[RowProblem]]:
    """The readable rows of an upload and a problem per unreadable row (ragged CSV rows, bad JSONL lines)."""
    return read_rows(raw, name)


def read_location(path: str) -> tuple[pd.DataFrame, tuple[str, ...] | None, list[RowProblem]]:
    """A file path (CSV / JSONL / Parquet) or a WRENCH folder; WRENCH also gives its label names. Read again
    when a file changed (the expert fixed the rows the preview named), else from the cache."""
    location = Path(path).expanduser()
    if not location.exists():
        raise IngestError(f"{location} does not exist")
    return _read_location(str(location), _stamp(location))


def _stamp(location: Path) -> tuple:
    """What says a file or a WRENCH folder's files changed: each one's size and modification time."""
    files = sorted(p for p in location.iterdir() if p.is_file()) if location.is_dir() else [location]
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)


@st.cache_data(show_spinner="Reading…", max_entries=4)
def _read_location(path: str, stamp: tuple) -> tuple[pd.DataFrame, tuple[str, ...] | None, list[RowProblem]]:
    location = Path(path)
    try:
        if location.is_dir():
            return read_wrench_rows(location)
        frame, problems = read_rows(location)
    except IngestError:
        raise
    except (ValueError, KeyError, AttributeError, TypeError, OSError) as err:  # a malformed or unreadable file
        raise IngestError(f"{location.name} could not be read: {type(err).__name__}: {err}") from err
    return frame, None, problems


def read_problems_table(problems: list[RowProblem], what: str) -> None:
    """Rows the reader could not read: a warning and a table naming each row and why."""
    if not problems:
        return
    st.warning(f"{len(problems):,} row(s) of the file {what}; the preview shows the readable rows. Fix them in the "
               "file, or tick **Import the good rows and skip the bad ones** below.")
    st.dataframe(pd.DataFrame([(p.place, p.reason) for p in problems], columns=["row", "problem"]),
                 hide_index=True, height=min(300, 38 + 35 * len(problems)))


def start_cards() -> None:
    """Two cards: load the bundled demo in one click, or create an empty workspace by name."""
    demo, new = st.columns(2, border=True)
    with demo:
        st.subheader("Try it on the demo")
        st.write("2,056 real YouTube comments labeled HAM or SPAM (UCI YouTube Spam Collection, CC BY 4.0): "
                 "1,686 unlabeled, 120 for dev, 250 held out.")
        if st.button("Load the demo", type="primary", icon=":material/rocket_launch:", key="load_demo"):
            try:
                with st.spinner("Importing the demo…"):
                    name, report = workspace.load_demo()
            except (IngestError, OSError) as err:  # nothing is left behind: see workspace.load_demo
                st.error(f"The demo could not be loaded: {str(err).splitlines()[0]}")
                return
            start_embed(workspace.workdir(name))  # while the expert looks around and evolves
            state.select_workspace(name)
            state.put(state.LAST_IMPORT, report)
            state.flash(f"Demo loaded into workspace {name}. Next: Evolve.")
            st.rerun()
    with new:
        st.subheader("Start a project")
        if st.session_state.pop("new_ws_created", False):  # set to "" before it is drawn: the browser kept the name
            st.session_state["new_ws"] = ""
        new_name = st.text_input("New workspace name", placeholder="e.g. adverse-events-2024", key="new_ws")
        if st.button("Create workspace", icon=":material/create_new_folder:", key="create_ws"):
            problem = workspace.check_name(new_name)
            if problem:
                st.error(f"Workspace name: {problem}.")
            elif workspace.exists(new_name):
                st.error(f"Workspace {new_name!r} already exists; pick it in the sidebar.")
            else:
                workspace.open_store(new_name)
                state.select_workspace(new_name)
                st.session_state["new_ws_created"] = True  # the box is for the next one (it kept this name)
                st.rerun()
        st.caption(f"Workspaces live in `{workspace.home()}`.")


ROW_NUMBERS = ("*row* counts the data rows, 1 being the first under the header (a file's *line* number, as a broken "
               "quote is named by, is one more in a CSV)")


def _guess(columns: list[str], *names: str) -> int | None:
    lowered = [c.lower() for c in columns]
    for name in names:
        if name in lowered:
            return lowered.index(name)
    return None


def _optional(label: str, columns: list[str], guess: int | None, key: str, help: str) -> str | None:
    options = [NONE, *columns]
    chosen = st.selectbox(label, options, index=0 if guess is None else guess + 1, key=key, help=help)
    return None if chosen == NONE else chosen


def column_mapping(frame: pd.DataFrame, wrench_labels: tuple[str, ...] | None, dataset: str) -> IngestOptions:
    """Widgets mapping the file's columns onto the task; returns the options to import with."""
    columns = [str(c) for c in frame.columns]
    left, right = st.columns(2)
    with left:
        # what the expert typed outlives the file: a run that swaps the upload draws no form, and Streamlit drops the
        # state of the widgets it did not draw (a fixed file uploaded again emptied the name and the instructions)
        # (a name typed is kept for that file: another file opens with its own name)
        typed_name = state.kept("map_task_name")
        widgets.default_from("map_task_name", dataset,
                             typed_name[1] if typed_name and typed_name[0] == dataset and typed_name[1] else dataset)
        task_name = st.text_input("Task name", key="map_task_name", help="shown in every screen's banner",
                                  on_change=lambda: state.keep("map_task_name",
                                                               (dataset, st.session_state["map_task_name"])))
        chosen = choose_text_column(frame)
        text_col = st.selectbox("Text column", columns, index=columns.index(chosen) if chosen in columns else 0,
                                key="map_text", help="the text the annotators read; chosen by content (the column "
                                                     "with the longest free text), change it if that is wrong")
        if chosen is None:
            st.warning("No column reads like free text (cells of several words): choose the text column.")
        # an EvoPool export's `label` holds a model's labels: its gold is `gold_label` (engine.ingest.importer)
        gold_first = (EXPORT_LABELS,) if is_export(columns) else ()  # not the model's `label`
        label_col = _optional("Label column", columns, _guess(columns, *gold_first, "label", "labels", "class", "gold"),
                              "map_label", "gold labels; rows without one are unlabeled work")
        split_col = _optional("Split column", columns, _guess(columns, "split", "set", "partition"), "map_split",
                              "pool / dev / test (train / valid also work); empty: drawn for you")
        id_col = _optional("Id column", columns, _guess(columns, "id", "uid", "example_id"), "map_id",
                           "unique row ids; none: row numbers")
    reserved = {text_col, label_col, split_col, id_col}
    with right:
        written = set(model_columns(columns) or ())  # an EvoPool file's model columns: never fields
        extra = [c for c in columns if c not in reserved and c not in written]
        fields = st.multiselect("Extra fields the annotators may read", extra, default=extra, key="map_fields")
        multi, sep_col = st.columns([1, 1])
        multi_label = multi.checkbox("Multi-label", key="map_multi",
                                     help="a label cell may hold several labels (JSONL: a list)")
        separator = sep_col.text_input("Label separator", "|", key="map_sep", disabled=not multi_label,
                                       help="between the labels of one cell, e.g. sports|politics")
        # an EvoPool file's classes, in order, are its p_* columns
        found = wrench_labels or model_classes(columns) or _labels_in(frame, label_col,
                                                                     separator if multi_label else None)
        # read from the file again when what it finds changes (another file, label column or separator, a fixed cell),
        # but an order the expert typed stays for the labels still found (a fixed file uploaded again, and again)
        typed = state.kept("map_labels") or []
        ordered = [label for label in typed if label in found] + [label for label in found if label not in typed]
        keep = not any("," in label for label in found)
        widgets.default_from("map_labels", (dataset, label_col, multi_label, separator, tuple(found)),
                             ", ".join(ordered if keep else found))
        # every edit the expert makes is kept (a callback: typing the default back is an edit too)
        label_text = st.text_input("Label set (comma separated, in order)", key="map_labels",
                                   on_change=lambda: state.keep("map_labels", [
                                       label.strip() for label in st.session_state["map_labels"].split(",")
                                       if label.strip()]))
        if found and not wrench_labels:
            counts = label_counts(frame, label_col, separator if multi_label else None)
            st.caption(found_labels_note({**{label: 0 for label in found}, **counts}))
        # the labels found, as found, while the box is untouched: a label may itself hold a comma ('yes, definitely')
        untouched = label_text == ", ".join(found)
        labels = found if untouched else tuple(x.strip() for x in label_text.split(",") if x.strip())
        size_col, audit_col = st.columns([1, 1])
        cells = frame[label_col] if label_col else pd.Series([], dtype=object)
        n_labeled = int((cells.notna() & cells.astype(str).str.strip().ne("")).sum())
        # another file (or label column) brings its own default: the box kept the last file's size and the plan
        # said "dev 280" for a file whose own default was 417
        widgets.default_from("map_dev", (dataset, label_col, n_labeled), max(20, min(IngestOptions.dev_size,
                                                                                      n_labeled)))
        dev_size = size_col.number_input("Dev size (labeled rows used as fitness)", 20, 100_000, step=50, key="map_dev",
                                         help=f"the file has {n_labeled:,} labeled rows; labeled rows beyond dev "
                                              "become the test (holdout) split")
        audit = audit_col.number_input(
            "Audit share of dev", 0.0, 0.5, 0.2, step=0.05, key="map_audit",
            help="dev rows held back from the agents and the gate, so choosing the aggregator on them is honest "
                 "(none when it would come to fewer than 50 rows)")
    descriptions = _descriptions(labels)
    instructions = st.text_area("Task instructions (what the agents read)", value=state.kept("map_instructions", ""),
                                key="map_instructions",
                                placeholder="e.g. Label each comment SPAM if it promotes a channel or a link…",
                                on_change=lambda: state.keep("map_instructions", st.session_state["map_instructions"]))
    skip = st.checkbox("Import the good rows and skip the bad ones", key=state.SKIP_BAD_ROWS)
    # untouched, the import reads the labels from the file as this form did, and names any that differ only in
    # case or spacing ('None' / 'none'); a typed set is taken as given
    given = None if untouched and not wrench_labels else labels or None
    return IngestOptions(task_name=task_name.strip() or None, text_column=text_col, label_column=label_col,
                         split_column=split_col, id_column=id_col,
                         field_columns=tuple(fields), labels=given, label_descriptions=descriptions,
                         instructions=instructions.strip(), dev_size=int(dev_size), audit_fraction=float(audit),
                         skip_bad_rows=skip,
                         multi_label=multi_label, label_separator=separator or "|")


def _labels_in(frame: pd.DataFrame, column: str | None, separator: str | None = None) -> tuple[str, ...]:
    """Every label name found in a column, read as the import reads a cell; with a separator, a cell may hold
    several. The whole column: a cut-down set makes the import refuse every row of a label left out."""
    return tuple(sorted(label_counts(frame, column, separator)))


def label_counts(frame: pd.DataFrame, column: str | None, separator: str | None = None) -> dict[str, int]:
    """{label: rows holding it}, each cell read as the import reads it (split on `separator` when given)."""
    if column is None:
        return {}
    values = frame[column].dropna()
    if separator:  # multi-label: split joined cells, unpack list cells (JSONL)
        values = values.map(lambda v: list(v) if isinstance(v, (list, tuple, np.ndarray)) else str(v).split(separator))
        values = values.explode().dropna()
    texts = values.map(cell_text)
    return {str(k): int(v) for k, v in texts[texts != ""].value_counts().items()}


def found_labels_note(counts: dict[str, int]) -> str:
    """The labels the box was filled with, with their rows: a typo or a stray label holds a row or two, and read
    as a set it looked confirmed."""
    shown = " · ".join(f"{escape_md(label)} {counts[label]:,}" for label in sorted(counts))
    rare = sorted(escape_md(label) for label, n in counts.items() if 0 < n <= 2)
    return (f"Found in the file (rows each): {shown}."
            + (f" Held by only one or two rows: {', '.join(rare)}; a typo? Remove a label from the box to make its "
               "rows bad rows (listed below), or keep it as a class." if rare else ""))


def _descriptions(labels: tuple[str, ...]) -> dict[str, str]:
    """A description per label, typed in a table. What was typed is kept by label name (`state.IMPORT_DESCRIPTIONS`):
    the table is drawn anew for another label set (a label renamed in the box, a fixed file uploaded again), and
    every description typed was lost with it."""
    if not labels:
        return {}
    typed: dict[str, str] = st.session_state.setdefault(state.IMPORT_DESCRIPTIONS, {})
    table = pd.DataFrame({"label": list(labels), "description": [typed.get(label, "") for label in labels]})
    edited = st.data_editor(table, key=f"map_desc_{'|'.join(labels)}", hide_index=True, disabled=["label"])
    for row in edited.itertuples():
        typed[row.label] = "" if pd.isna(row.description) else str(row.description).strip()
    return {label: typed[label] for label in labels if typed.get(label)}


def plan_summary(frame: pd.DataFrame, opts: IngestOptions, wrench_labels: tuple[str, ...] | None,
                 problems: list[RowProblem]) -> bool:
    """Before anything is written: how many rows go to dev (and audit), test and the pool, and what is wrong.
    Whether it listed the bad rows (a large file's plan waits for a click)."""
    if len(frame) > PLAN_MAX_ROWS and not st.button("Check the import first", key="plan_check"):
        st.caption(f"{len(frame):,} rows: **Check the import first** shows the splits before anything is written.")
        return False
    try:
        plan = plan_import(frame, opts, wrench_labels, problems)
    except IngestError as err:
        st.error(str(err))
        return False
    counts = plan.split_counts()
    st.info("This import would write: " + " · ".join(
        f"{what} **{counts.get(key, 0):,}**" for what, key in
        (("dev", "dev"), ("of which audit", "audit"), ("test (holdout)", "test"), ("unlabeled pool", "pool"))))
    for note in plan.notes:
        st.caption(note)
    fatal, rows = _whole_file(plan.problems)
    for reason in fatal:
        st.error(f"This file cannot be imported as it is: {reason}.")
    if rows:
        st.warning(f"{len(rows):,} bad row(s)"
                   + (" will be skipped." if opts.skip_bad_rows else ": nothing is imported until they are fixed "
                      "or skipped."))
        st.dataframe(bad_rows_table(rows, frame, opts.id_column), hide_index=True,
                     height=min(300, 38 + 35 * min(len(rows), 200)))
        st.caption(ROW_NUMBERS)
    return bool(rows)


def bad_rows_table(rows: list[RowProblem], frame: pd.DataFrame, id_column: str | None,
                   limit: int = 200) -> pd.DataFrame:
    """The first `limit` bad rows with their place in the file, their id (when the file has an id column) and why."""
    table = pd.DataFrame([(p.place, p.reason) for p in rows[:limit]], columns=["row", "problem"])
    if id_column and id_column in frame:
        ids = {int(p) + 1: cell for p, cell in zip(row_positions(frame), frame[id_column], strict=True)}
        table.insert(1, "id", [cell_text(ids[p.row]) if p.row in ids else "" for p in rows[:limit]])
    return table


def _whole_file(problems: list[RowProblem]) -> tuple[list[str], list[RowProblem]]:
    """(reasons of the problems of the whole file, the bad rows): row 0 is the file itself (e.g. fewer than two
    labels), which skipping bad rows cannot fix, so it is never told as a bad row to skip."""
    return [p.reason for p in problems if p.row == 0], [p for p in problems if p.row != 0]


def start(store: Store, frame: pd.DataFrame, opts: IngestOptions, *, dataset: str, source: str,
          wrench_folder: str | None = None, wrench_labels: tuple[str, ...] | None = None,
          read_problems: list[RowProblem] | None = None, asked_as: str | None = None) -> None:
    """Start the import as a background job (validating 100K rows takes seconds). `asked_as`: what the form asked
    (`asked`), so that its failure is shown only while the form asks the same."""
    state.put(state.IMPORT_ASKED, asked_as if asked_as is not None else asked(opts, source))
    try:
        start_import(store.path.parent, frame, opts, dataset=dataset, source=source, labels=wrench_labels,
                     wrench_folder=wrench_folder, read_problems=read_problems or [])
    except RuntimeError as err:  # an import is already running here
        st.error(str(err))


def progress(store: Store) -> None:
    """While an import runs: a progress line, polled; when it ends, the page refreshes itself."""
    workdir = store.path.parent
    if REGISTRY.running(workdir, "import") is None:
        return

    def poll(refresh_app: AppRefresh) -> None:
        job = REGISTRY.latest(workdir, "import")
        if job is None or not job.running:
            refresh_app()
            return
        st.progress(min(max(job.progress, 0.05), 1.0), text=f"Importing: {job.message}…")

    poll_job(poll, 0.5)


def unseen_report(store: Store) -> ImportReport | None:
    """The report of this workspace's last finished import job, once per session, while the workspace still holds
    what it says: a reload long after, with rows labeled into dev since, showed "dev: 350, pool: 100" above metrics
    that said 352 and 98."""
    job = REGISTRY.latest(store.path.parent, "import")
    if job is None or job.status != "done" or state.get(state.IMPORT_SHOWN) == job.id:
        return None
    state.put(state.IMPORT_SHOWN, job.id)
    report: ImportReport | None = job.result
    if report is not None and store.split_counts() != {k: v for k, v in report.split_counts.items() if v}:
        return None
    return report


def asked(opts: IngestOptions, source: str, content: str = "") -> str:
    """What an import was asked with (the file, which upload or state of it, and the form's settings), to tell a
    failure's form from today's: a file fixed and uploaded again under its name is another import."""
    return f"{source}#{content}|{opts!r}"


def file_state(location: str) -> str:
    """A path's state on the server (size and time of change, of every file of a folder), '' when unreadable."""
    path = Path(location)
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    except OSError:
        return ""


def show_problems(store: Store, now: str | None = None, listed: bool = False) -> None:
    """The last failed import: the message and a table naming each bad row and why. Not once the form differs from
    the one it failed with (`now`, `asked`): its error stood below a form that had fixed it; the
    plan above the Import button tells where the form stands now."""
    job = REGISTRY.latest(store.path.parent, "import")
    if job is None or job.status != "failed":
        return
    if now is not None and state.get(state.IMPORT_ASKED) not in (None, now):
        return
    err = job.exception
    if not isinstance(err, IngestError):
        st.error(f"The import failed: {escape_md(job.error)}")
        return
    fatal, rows = _whole_file(err.problems)
    problems = [(p.place, p.reason) for p in rows]
    said = str(err).splitlines()[0].removesuffix("; nothing was imported")  # said once, first
    st.error(f"Nothing was imported: {escape_md(said)}."
             + "".join(f"  \nThe file as a whole: {escape_md(reason)}." for reason in fatal))
    if problems:
        if not listed:  # the plan above lists them, with their ids, for the form the import failed with
            table = pd.DataFrame(problems, columns=["row", "problem"])
            st.dataframe(table, hide_index=True, height=min(400, 38 + 35 * len(table)))
        st.info("Fix these rows in the file, or tick **Import the good rows and skip the bad ones** and import "
                "again.")


def show_report(report: ImportReport) -> None:
    st.success(f"Imported {report.n_rows:,} rows into splits "
               + ", ".join(f"{k}: {v:,}" for k, v in report.split_counts.items())
               + f" · labels {escape_md(', '.join(report.labels))}")
    for note in report.notes:
        st.caption(note)
    if report.skipped:
        st.warning(f"Skipped {len(report.skipped)} bad row(s):")
        st.dataframe(pd.DataFrame([(p.place, p.reason) for p in report.skipped], columns=["row", "problem"]),
                     hide_index=True)
