"""Pieces of the Labels & export screen: saved soft labels, their plots' inputs, browsing, and the files out."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import streamlit as st

from engine import export, score
from engine.aggregators.choice_names import (
    STUDENT,
    VOTE_STUDENT,
    describe_choice,
    ingredient_name,
    is_student,
    reads_votes_at_prediction,
)
from engine.aggregators.registry import DESCRIPTIONS, aggregator_entry, predict_labels
from engine.domain import ABSTAIN, AUDIT, AutoChoice, SoftLabels
from engine.labeling import multilabel_scores
from engine.store.saved_labels import SavedLabels, load_labels
from engine.store.workspace import Store
from studio import queries, workspace

BROWSE_PAGE = 25
MIME = {"csv": "text/csv", "jsonl": "application/jsonl", "parquet": "application/vnd.apache.parquet"}


@st.cache_data(show_spinner=False, max_entries=16)
def _saved(name: str, aggregator: str, stamp: float) -> SavedLabels | None:
    return load_labels(workspace.workdir(name), aggregator)


def saved(name: str, aggregator: str) -> SavedLabels | None:
    """The soft labels a labels job saved for this aggregator (cached until the file changes)."""
    path = workspace.workdir(name) / "labels" / f"{aggregator}.npz"
    return _saved(name, aggregator, path.stat().st_mtime if path.exists() else 0.0)


@st.cache_data(show_spinner=False, max_entries=8)
def _frame(name: str, aggregator: str, created_at: str, threshold: float | None, rows_version: object
           ) -> pd.DataFrame:
    store = workspace.open_store(name)
    result = saved(name, aggregator)
    if threshold is not None:
        result = at_threshold(store, result, threshold)
    soft = SoftLabels(result.probs, result.example_ids, result.resolved)
    return export.labeled_frame(store, soft, result.hard, result.n_votes)


def labeled_frame(name: str, result: SavedLabels) -> pd.DataFrame:
    """Every row with its hard label, confidence, per-class probabilities and provenance (the export). Its split
    and gold_label columns are the workspace's now, so its rows' version is in the cache key: rows labeled into dev
    since must read as dev in this session's download as in any other's."""
    threshold = result.dev_scores.threshold if result.hard.ndim == 2 else None
    return _frame(name, result.aggregator, result.created_at, threshold, workspace.open_store(name).rows_version())


def at_threshold(store: Store, result: SavedLabels, threshold: float) -> SavedLabels:
    """Multi-label soft labels decided at another threshold: no refit, the probabilities stay; the dev figures
    are recomputed from the dev rows' out-of-fold probabilities, so choosing a threshold by them is honest."""
    if result.hard.ndim != 2 or result.dev_scores.threshold == threshold:
        return result
    hard = predict_labels(result.probs, threshold)
    position = pd.Series(np.arange(len(result.example_ids)), index=pd.Index(result.example_ids))
    dev = position[store.example_ids("dev")].to_numpy()
    gold = store.gold("dev")
    scores = dataclasses.replace(result.dev_scores, **multilabel_scores(gold, hard[dev]), threshold=threshold)
    audit = position[store.example_ids(AUDIT)].to_numpy()
    if len(audit):
        scores = dataclasses.replace(scores,
                                     audit_macro_f1=multilabel_scores(store.gold(AUDIT), hard[audit])["macro_f1"])
    return dataclasses.replace(result, hard=hard, dev_scores=scores)


def dev_parts(store: Store, result: SavedLabels) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (n_dev, k), gold (n_dev,) or multi-label (n_dev, k)) of the dev rows, for the plots."""
    position = pd.Series(np.arange(len(result.example_ids)), index=pd.Index(result.example_ids))
    dev_ids = store.example_ids("dev")
    return result.probs[position[dev_ids].to_numpy()], store.gold("dev")


def labeled_rows(result: SavedLabels) -> np.ndarray:
    """(n,) bool: rows that got a label (multi-label: at least one)."""
    return result.hard.any(axis=1) if result.hard.ndim == 2 else result.hard != ABSTAIN


def plot_inputs(result: SavedLabels, dev_probs: np.ndarray, dev_gold: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """What the three plots draw: confidence of labeled rows, class shares (predicted, dev), reliability points.

    Multi-label: class shares are the share of rows carrying each class, and reliability pairs each
    per-class probability with whether the class is in the dev row's set.
    """
    labeled = labeled_rows(result)
    out = {"confidence": export.confidence(result.probs, result.hard)[labeled]}
    if result.hard.ndim == 2:
        out["predicted"] = result.hard.mean(axis=0) if len(result.hard) else np.zeros(k)
        out["dev"] = dev_gold.mean(axis=0) if len(dev_gold) else np.zeros(k)
        out["rel_confidence"], out["rel_correct"] = dev_probs.ravel(), dev_gold.ravel().astype(float)
        return out
    out["predicted"] = np.bincount(result.hard[labeled], minlength=k) / max(1, labeled.sum())
    out["dev"] = np.bincount(dev_gold[dev_gold >= 0], minlength=k) / max(1, (dev_gold >= 0).sum())
    out["rel_confidence"] = dev_probs.max(axis=1)
    out["rel_correct"] = (dev_probs.argmax(axis=1) == dev_gold).astype(float)
    return out


@st.cache_data(show_spinner=False, max_entries=8)
def _disagreement(name: str, version: tuple, splits: tuple[str, ...]) -> pd.Series:
    """Vote entropy per example id over `splits` (those the pool has voted on: in the key, so a labels job that
    votes on the rest is seen; the workspace's version does not move for votes)."""
    store = workspace.open_store(name)
    pool = store.pool_ids()
    out = []
    for split in splits:
        matrix = store.vote_matrix(pool, split)
        out.append(pd.Series(score.disagreement(matrix.votes), index=list(matrix.example_ids)))
    return pd.concat(out) if out else pd.Series(dtype=float)


def browse(name: str, store: Store, frame: pd.DataFrame, labels: tuple[str, ...]) -> None:
    """Filter the labeled rows by class, confidence and disagreement; one page at a time.

    A multi-label frame (a `labels` column) matches a class when the class is in the row's label set.
    """
    a, b, c, d = st.columns([2, 2, 2, 1])
    classes = a.multiselect("Class", list(labels) + ["(no label)"], key="browse_class")
    low, high = b.slider("Confidence", 0.0, 1.0, (0.0, 1.0), 0.01, key="browse_conf")
    only_disputed = c.toggle("Only rows where annotators disagree", key="browse_disputed")
    split = d.selectbox("Split", ["all", "pool", "dev", "test"], key="browse_split")
    mask = frame["confidence"].between(low, high)
    if classes and "labels" in frame:
        sep = export.label_separator(store)
        sets = [set(s.split(sep)) if s else {"(no label)"} for s in frame["labels"]]
        mask &= np.array([bool(s & set(classes)) for s in sets], dtype=bool)
    elif classes:
        mask &= frame["label"].replace("", "(no label)").isin(classes)
    if split != "all":
        mask &= frame["split"] == split
    if only_disputed:
        entropy = _disagreement(name, workspace.version(store),
                                tuple(queries.splits_with_votes(store, ("pool", "dev", "test"))))
        mask &= frame["id"].map(entropy).fillna(0).to_numpy() > 0
    hits = frame[mask]
    pages = max(1, -(-len(hits) // BROWSE_PAGE))
    page = st.number_input(f"Page (of {pages:,}; {len(hits):,} matching rows)", 1, pages, 1, key="browse_page")
    shown = hits.iloc[(int(page) - 1) * BROWSE_PAGE: int(page) * BROWSE_PAGE]
    st.dataframe(shown, hide_index=True, column_config={
        "confidence": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="%.2f")})


def comparison_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """compare_aggregators' rows with readable headers, best dev macro-F1 first."""
    names = {"aggregator": "aggregator", "macro_f1": "dev macro-F1 (out-of-fold)", "accuracy": "dev accuracy",
             "ece": "calibration error (ECE)", "n": "dev rows", "chosen": "auto chose",
             "audit_macro_f1": "audit-row macro-F1 (out-of-fold)", "n_audit": "audit rows",
             "chosen_on": "auto chose on", "uses_pool": "uses the pool's votes",
             "left_out": "auto left out (the pool was chosen on these rows)"}
    left_out = _left_out_by_auto(comparison)
    table = comparison.rename(columns=names)
    # a row auto left out holds the inflated figure of votes chosen on these very rows: said on the row, and
    # listed after the rows auto weighed (it ranked first and made auto's choice look like a loss)
    table.insert(1, "auto's view", ["left out: reads votes the pool was chosen on, so its figure is inflated"
                                    if ingredient_name(str(a)) in left_out else "" for a in table["aggregator"]]
                 if "aggregator" in table else "")
    for column in ("auto chose", "auto chose on", names["left_out"]):
        if column in table:
            table[column] = table[column].map(_cell)
    if names["uses_pool"] in table:
        table[names["uses_pool"]] = table[names["uses_pool"]].map(
            lambda v: "" if v is None or v != v else ("yes" if v else "no"))
    key = "audit-row macro-F1 (out-of-fold)" if "audit-row macro-F1 (out-of-fold)" in table else (
        "dev macro-F1 (out-of-fold)")  # audit rows are the honest ranking where there are some
    if key not in table:
        return table
    weighed = table["auto's view"] == ""
    return pd.concat([table[weighed].sort_values(key, ascending=False, kind="stable"),
                      table[~weighed].sort_values(key, ascending=False, kind="stable")])


def _left_out_by_auto(comparison: pd.DataFrame) -> set[str]:
    """The ingredients auto left out, as the comparison's `auto` row lists them (auto's names: `ingredient_name`)."""
    if not {"aggregator", "left_out"} <= set(comparison.columns):
        return set()
    return {str(name) for value in comparison.loc[comparison["aggregator"] == "auto", "left_out"]
            if isinstance(value, (list, tuple, np.ndarray)) for name in value}


def _cell(value: object) -> str:
    """A table cell for a name or a list of names: '' for none (not "None" or "nan")."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(map(str, value))
    return str(value)


def student_note(comparison: pd.DataFrame) -> str | None:
    """Why auto's dev figure can sit below a model it weighed (its choice is a student it kept over a teacher that
    scored higher on dev), or None when it does not."""
    if comparison.empty or not {"aggregator", "macro_f1"} <= set(comparison.columns):
        return None
    rows = comparison.set_index("aggregator")
    if "auto" not in rows.index:
        return None
    chosen = str(rows.loc["auto"].get("chosen", "") or "")
    skipped = {"auto", "auto-text", "auto-pool", *_left_out_by_auto(comparison)}
    weighed = rows[[ingredient_name(str(a)) not in skipped for a in rows.index]]["macro_f1"].dropna()
    students = is_student(chosen) or (chosen.startswith("avg(") and STUDENT in chosen)  # one, or a mean of some
    if not students or weighed.empty or float(weighed.max()) <= float(rows.loc["auto", "macro_f1"]):
        return None
    best = f"{weighed.idxmax()}'s ({float(weighed.max()):.3f})"
    return (f"Auto chose {chosen}, whose dev figure is below {best}: it keeps a student (a text model trained "
            "on a teacher's labels of the unlabeled rows) over its teacher unless the teacher beats it in every "
            "bootstrap draw of the dev rows. On the withheld gold labels of rows nobody labeled, students scored at "
            "least their teacher's macro-F1 in 38 of 42 runs (README, bench/student_validation.py).")


def pool_verdict(comparison: pd.DataFrame) -> tuple[bool, str] | None:
    """Does the pool earn its place? From the comparison's `auto` and `auto-text` rows (each its dev out-of-fold
    macro-F1, the column the table shows): (whether auto's choice reads the pool's votes and leads there, the
    sentence saying so); None when the comparison lacks either row (multi-label tasks compare neither)."""
    if comparison.empty or "aggregator" not in comparison:
        return None
    rows = comparison.set_index("aggregator")
    if not {"auto", "auto-text"} <= set(rows.index):
        return None
    auto = rows.loc["auto"]
    uses_pool = auto.get("uses_pool") == 1  # True; a NaN (no such figure) is not
    # the best figure of a model that reads no votes: auto-text's choice, or a text-only model of the table that
    # scored higher on dev (the screen once said the pool led while `embedding` stood above it in the table)
    text_only = [a for a in rows.index if a == "auto-text" or (a in DESCRIPTIONS and not aggregator_entry(a).reads_votes
                                                              and not aggregator_entry(a).chooses)]
    best = max(text_only, key=lambda a: (float(rows.loc[a, "macro_f1"]), a == "auto-text"))
    ours, theirs = float(auto["macro_f1"]), float(rows.loc[best, "macro_f1"])
    named = f"auto-text: {rows.loc['auto-text'].get('chosen', '')}" if best == "auto-text" else best
    versus = f"{ours:.3f} dev macro-F1 (out-of-fold) against {theirs:.3f} for the best model without the pool " \
             f"({named})"
    advice = ("describe the weak classes (Project screen), label more of their rows, or write or edit annotators for "
              "them, then evolve again.")
    if not uses_pool:
        return False, (f"The text alone does as well here: auto chose a model that reads no votes, {versus}. The pool "
                       f"earns its place by adding what the text misses: {advice}")
    how = _how_it_uses_the_pool(str(auto.get("chosen", "")))
    if ours <= theirs:
        return False, (f"Auto's choice {how} (chosen on the rows that "
                       "judge what reads them), yet "
                       f"{versus}: on dev the pool does not lead yet. To make it lead: {advice}")
    said = f"The pool earns its place here: auto's choice {how}, {versus}."
    if auto.get("chosen_on") != "audit":
        audit_rows = auto.get("n_audit")
        few = (f"too few audit rows ({int(audit_rows)}) to judge it" if audit_rows == audit_rows and audit_rows
               else "no audit rows")
        said += (f" There are {few}: the pool was chosen on these dev rows, so figures that read its votes lean "
                 "optimistic.")
    return True, said


def _how_it_uses_the_pool(chosen: str) -> str:
    """How a choice that uses the pool uses it: by reading its votes on every row it labels, or (a student of a
    teacher that reads them) by having learned from that teacher's labels, reading only the text when it labels."""
    if not chosen or reads_votes_at_prediction(chosen):
        return "reads the pool's votes"
    return "learned from a teacher that reads the pool's votes (it reads only the text when it labels a row)"


def manifest_json(store: Store, result: SavedLabels, frame: pd.DataFrame, spreadsheet: bool = False) -> str:
    """The export manifest (what `evopool export` writes beside the file) for these saved labels: the pool that made
    them (when they recorded it) and, for a spreadsheet-safe CSV, how many cells it quoted."""
    soft = SoftLabels(result.probs, result.example_ids, result.resolved)
    extra = {"dev_scores": result.dev_scores.to_dict(), "computed_at": result.created_at}
    if spreadsheet:
        extra["spreadsheet_safe"] = {"quoted_cells": export.spreadsheet_safe(frame)[1]}
    return json.dumps(export.manifest(store, soft, frame, extra, result.dev_scores.threshold,
                                      result.pool_ids or None), indent=2, default=str)


def _auto_help(choice: AutoChoice, n_audit: int | None) -> str:
    """What auto chose, on which rows, and what it left out and why."""
    chosen = choice.chosen
    text = f"auto chose {chosen}: {describe_choice(chosen)}"
    if choice.chosen_on == "audit":
        text += (f", judged on {n_audit} audit rows the pool was not chosen on" if reads_votes_at_prediction(chosen)
                 else ", judged on all dev rows (it reads no votes when it labels a row)")
    elif choice.chosen_on == "dev":
        text += ", judged on all dev rows (too few audit rows)"
    if choice.left_out:
        text += (f"; left out {', '.join(choice.left_out)}: the pool was chosen on these same rows, so their "
                 "dev figures are inflated")
    return text + _student_help(chosen)


def _student_help(chosen: str) -> str:
    """How a student (or the mean of several) came to be chosen, or nothing for any other choice."""
    learns = ". A student learns from its teacher's labels of thousands of unlabeled rows"
    if chosen.startswith("avg(student"):
        return (learns + "; students of different teachers err on different rows, and their mean was chosen on a "
                "higher score than any of them")
    if chosen.startswith(VOTE_STUDENT):
        return (learns + " and reads the text and the pool's votes: it learns how far to trust each annotator on rows "
                "the pool was not chosen on; chosen on a higher score")
    if is_student(chosen):
        return (learns + " and reads only the text; auto keeps it over its teacher unless the teacher beats it in "
                "every resample of the rows it is judged on")
    return ""


def summary_metrics(result: SavedLabels) -> None:
    labeled = labeled_rows(result)
    cols = st.columns(4)
    cols[0].metric("Rows labeled", f"{int(labeled.sum()):,} / {len(result.hard):,}")
    mean_confidence = export.confidence(result.probs, result.hard)[labeled].mean() if labeled.any() else None
    cols[1].metric("Mean confidence", f"{mean_confidence:.2f}" if mean_confidence is not None else "–")
    scores = result.dev_scores
    auto_text = _auto_help(scores.choice, scores.n_audit) if scores.choice is not None else None
    cols[2].metric("Aggregator", result.aggregator, help=auto_text)
    best, audit = scores.macro_f1, scores.audit_macro_f1
    if isinstance(audit, float):  # the honest figure first: rows the pool was not selected on
        cols[3].metric("Labels' audit macro-F1", f"{audit:.3f}",
                       help=f"out-of-fold, on the {scores.n_audit} dev rows the agents and the gate never "
                            f"saw; on all dev rows {best:.3f}")
    else:
        cols[3].metric("Labels' dev macro-F1", f"{best:.3f}" if isinstance(best, float) else "–",
                       help="out-of-fold; no audit rows: the pool was chosen on these rows, so vote-based figures "
                            "are optimistic")
    if auto_text:
        st.caption(auto_text[0].upper() + auto_text[1:] + ".")


