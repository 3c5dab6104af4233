"""Pieces of the Labels & export screen: saved soft labels, their plots' inputs, browsing, and the files out."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import streamlit as st

from engine.aggregators.choice_names import (
    STUDENT,
    describe_choice,
    reads_votes,
    reads_votes_at_prediction,
)
from engine.aggregators.registry import aggregator_entry, predict_labels
from engine.domain import ABSTAIN, AUDIT, AutoChoice, SoftLabels
from engine.export import files as export
from engine.labeling.fit import multilabel_scores
from engine.metrics import score
from engine.store.saved_labels import SavedLabels, load_labels
from engine.store.workspace import Store
from studio import queries, workspace

BROWSE_PAGE = 25
MIME = {"csv": "text/csv", "jsonl": "application/jsonl", "parquet": "application/vnd.apache.parquet"}


@st.cache_data(show_spinner=False, max_entries=16)
def _saved(name: str, aggregator: str, stamp: float) -> SavedLabels | None:
    return load_labels(workspace.workdir(name), aggregator)


def saved_stamp(name: str, aggregator: str) -> float:
    """When the soft labels of this aggregator were last saved (0 before any): a changed stamp, new labels."""
    path = workspace.workdir(name) / "labels" / f"{aggregator}.npz"
    return path.stat().st_mtime if path.exists() else 0.0


def saved(name: str, aggregator: str) -> SavedLabels | None:
    """The soft labels a labels job saved for this aggregator (cached until the file changes)."""
    return _saved(name, aggregator, saved_stamp(name, aggregator))


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
    """compare_aggregators' rows with readable headers, the best expected macro-F1 first. The expected figure is
    each aggregator's estimate from rows that neither fitted nor chose it (metrics/estimate.py), the one every screen
    shows; the dev and audit columns beside it are the raw out-of-fold figures."""
    table = comparison.copy()
    if "interval" in table:
        table["interval"] = table["interval"].map(
            lambda v: f"{v[0]:.3f}–{v[1]:.3f}" if isinstance(v, (list, tuple, np.ndarray)) and len(v) == 2 else "")
    if "judged_on" in table:
        table["judged_on"] = table["judged_on"].map(
            lambda v: {"audit": "audit rows", "dev": "all dev rows"}.get(v, "") if isinstance(v, str) else "")
    if "estimate" in table and "aggregator" in table:  # why a row has no estimate, on the row
        table["judged_on"] = [on if isinstance(est, float) and est == est else
                              "none: reads votes chosen on dev, and no audit rows" for est, on in
                              zip(table["estimate"], table.get("judged_on", [""] * len(table)), strict=True)]
    names = {"aggregator": "aggregator", "estimate": "expected macro-F1", "interval": "90% interval",
             "judged_on": "estimated on", "macro_f1": "dev macro-F1 (out-of-fold)", "accuracy": "dev accuracy",
             "ece": "calibration error (ECE)", "n": "dev rows", "chosen": "auto chose",
             "audit_macro_f1": "audit-row macro-F1 (out-of-fold)", "n_audit": "audit rows",
             "uses_pool": "uses the pool's votes"}
    table = table[[c for c in names if c in table]].rename(columns=names)
    if "auto chose" in table:
        table["auto chose"] = table["auto chose"].map(_cell)
    if names["uses_pool"] in table:
        table[names["uses_pool"]] = table[names["uses_pool"]].map(
            lambda v: "" if v is None or v != v else ("yes" if v else "no"))
    table = table.dropna(axis=1, how="all")  # no empty columns
    key = next((names[k] for k in ("estimate", "audit_macro_f1", "macro_f1") if names[k] in table), None)
    return table if key is None else table.sort_values(key, ascending=False, kind="stable", na_position="last")


def _cell(value: object) -> str:
    """A table cell for a name or a list of names: '' for none (not "None" or "nan")."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, (list, tuple, np.ndarray)):
        return ", ".join(map(str, value))
    return str(value)


def pool_verdict(comparison: pd.DataFrame) -> tuple[bool, str] | None:
    """Does the pool earn its place? From the comparison's `auto` and `auto-text` rows, each its expected macro-F1
    and interval: (whether auto's choice uses the pool and leads beyond the noise, the sentence saying so); None
    when the comparison lacks either row or an estimate (multi-label tasks compare neither)."""
    if comparison.empty or not {"aggregator", "estimate"} <= set(comparison.columns):
        return None
    rows = comparison.set_index("aggregator")
    if not {"auto", "auto-text"} <= set(rows.index):
        return None
    auto, text = rows.loc["auto"], rows.loc["auto-text"]
    if not all(isinstance(r.get("estimate"), float) and r.get("estimate") == r.get("estimate") for r in (auto, text)):
        return None
    ours, theirs = float(auto["estimate"]), float(text["estimate"])
    versus = (f"expected macro-F1 {ours:.3f} ({_interval(auto)}) against {theirs:.3f} ({_interval(text)}) for the "
              f"best model without the pool (auto-text: {text.get('chosen', '')})")
    advice = ("describe the weak classes (Project screen), label more of their rows, or write or edit annotators for "
              "them, then evolve again.")
    if auto.get("uses_pool") != 1:
        return False, (f"The text alone does as well here: auto chose a model that does not use the pool, {versus}. "
                       f"The pool earns its place by adding what the text misses: {advice}")
    how = _how_it_uses_the_pool(str(auto.get("chosen", "")))
    if ours <= theirs:
        return False, f"Auto's choice {how}, yet {versus}: the pool does not lead yet. To make it lead: {advice}"
    low = auto.get("interval")
    sure = isinstance(low, (list, tuple, np.ndarray)) and float(low[0]) > theirs
    return True, (f"The pool earns its place here: auto's choice {how}, {versus}." + (
        "" if sure else " The lead lies inside the interval: more audit rows would make it sure."))


def _interval(row: pd.Series) -> str:
    v = row.get("interval")
    if not isinstance(v, (list, tuple, np.ndarray)):
        return "no interval"
    return f"90% interval {float(v[0]):.2f}–{float(v[1]):.2f}"


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
    """What auto chose and on which rows it was judged: what uses the pool (a student of it included) on the audit
    rows the pool was not chosen on, what never reads it on all dev rows."""
    chosen = choice.chosen
    text = f"auto chose {chosen}: {describe_choice(chosen)}"
    if reads_votes(chosen) and choice.chosen_on == "audit":
        text += f", judged on {n_audit} audit rows the pool was not chosen on (it uses the pool)"
    elif choice.chosen_on == "audit":
        text += ", judged on all dev rows (it never reads the pool)"
    elif choice.chosen_on == "dev":
        text += (", judged on all dev rows" + ("" if not reads_votes(chosen) else " (the pool was not chosen on them)")
                 + ("; with the pool chosen on dev and too few audit rows, nothing that uses the pool was weighed"
                    if not reads_votes(chosen) else ""))
    return text + _student_help(chosen)


def _student_help(chosen: str) -> str:
    """How a student (or a mean holding one) came to be chosen, or nothing for any other choice."""
    if STUDENT in chosen:
        return (". A student learns from its teacher's labels of thousands of unlabeled rows and reads only the text "
                "when it labels a row; a mean was taken where the rows could not tell the two best apart")
    return ""


def headline(result: SavedLabels, labels: tuple[str, ...]) -> str:
    """The one figure to bet on, in a sentence (the same `Estimate` the CLI's `eval` prints)."""
    scores = result.dev_scores
    if scores.estimate is not None:
        said = "Expected test " + scores.estimate.sentence(labels) + "."
        if scores.uses_pool is False and aggregator_entry(result.aggregator).reads_votes:
            said += (" These labels read no votes: the model chosen learned from the text alone, so the pool did not "
                     "shape them.")
        return said
    if result.hard.ndim == 2:
        return "Multi-label labels: the dev figures below are out of fold, at the threshold shown."
    return ("No honest estimate: these labels read the pool's votes, the pool was chosen on these dev rows, and there "
            "are too few audit rows to judge it. Hold audit rows back at import (a larger dev), or choose auto-text.")


def summary_metrics(result: SavedLabels, labels: tuple[str, ...] = ()) -> None:
    scores = result.dev_scores
    (st.success if scores.estimate is not None else st.info)(headline(result, labels))
    labeled = labeled_rows(result)
    cols = st.columns(4)
    cols[0].metric("Rows labeled", f"{int(labeled.sum()):,} / {len(result.hard):,}")
    mean_confidence = export.confidence(result.probs, result.hard)[labeled].mean() if labeled.any() else None
    cols[1].metric("Mean confidence", f"{mean_confidence:.2f}" if mean_confidence is not None else "–")
    auto_text = _auto_help(scores.choice, scores.n_audit) if scores.choice is not None else None
    cols[2].metric("Aggregator", result.aggregator, help=auto_text)
    est = scores.estimate
    if est is not None:
        cols[3].metric("Expected macro-F1", f"{est.macro_f1:.2f}", help=(
            f"{est.level:.0%} interval {est.low:.3f}–{est.high:.3f}, from {est.n_rows} rows that neither fitted nor "
            "chose these labels"), delta=f"± {(est.high - est.low) / 2:.2f}", delta_color="off")
    else:
        best = scores.macro_f1
        cols[3].metric("Dev macro-F1 (inflated)", f"{best:.3f}" if isinstance(best, float) else "–",
                       help="out-of-fold on rows the pool was chosen on: optimistic, not an estimate")
    if auto_text:
        st.caption(auto_text[0].upper() + auto_text[1:] + ".")
