"""Cached queries the screens share: annotator tables, pool votes, paged rows, safe markdown.

Caches are keyed by the workspace name and `workspace.version(store)`, which changes when the data,
the verdicts or the generations change, so a page never shows stale numbers and never recomputes
unchanged ones.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pandas as pd
import streamlit as st

from engine.domain import ABSTAIN, AUDIT, FITNESS, Estimate
from engine.evolve import pool_audit_estimate
from engine.expert import review
from engine.expert.rows import PoolLikeness
from engine.markdown import code_span, escape_md  # noqa: F401 - the screens' markdown helpers, kept under queries
from engine.metrics import score
from engine.store.workspace import Store
from engine.weak_spots import weak_spots
from studio import state, workspace

T = TypeVar("T")

PAGE_SIZE = 25


def number(value: object, fmt: str) -> str:
    """A score for display; '–' where there is none (an annotator never scored)."""
    return "–" if value is None or pd.isna(value) else format(value, fmt)


def examples_page(store: Store, split: str, key: str, page_size: int = PAGE_SIZE) -> pd.DataFrame:
    """One page of a split's rows (id, text, label name); a page picker under it. Test labels stay hidden.

    A multi-label row shows its whole label set, comma separated."""
    total = store.count_examples(split)
    pages = max(1, -(-total // page_size))
    page = st.number_input(f"Page (of {pages:,}; {total:,} rows)", 1, pages, 1, key=f"{key}_{split}")
    frame = store.examples_frame(split, limit=page_size, offset=(int(page) - 1) * page_size)
    labels = store.load_task().labels
    out = pd.DataFrame({"id": frame["id"], "text": frame["text"]})
    if split == "dev":
        out["label"] = [", ".join(labels[c] for c in s) if s else labels[int(v)] if pd.notna(v) else ""
                        for v, s in zip(frame["label"], frame["label_set"], strict=True)]
    elif split == "test":
        out["label"] = "(holdout: hidden)"
    return out


@st.cache_data(show_spinner=False, max_entries=32)
def _annotator_table(name: str, version: tuple) -> pd.DataFrame:
    store = workspace.open_store(name)
    labels = store.load_task().labels
    pool = set(store.pool_ids())
    latest = store.latest_verdicts()
    log = store.verdicts()
    last_note = log.groupby("annotator_id")["note"].last() if not log.empty else pd.Series(dtype=object)
    scores = store.scores()
    rows = []
    for a in store.annotators():
        s = scores.get(a.id)
        verdict, by = latest.get(a.id, ("pending", ""))
        rows.append({
            "id": a.id, "name": a.name, "agent": a.agent, "author": a.author, "written_by": a.provenance,
            "generation": a.generation,
            "in_pool": a.id in pool, "verdict": verdict, "decided_by": by,
            # retired for its edit: a reject nobody gave (the picker says "replaced")
            "replaced": verdict == "reject" and review.replaced_by(str(last_note.get(a.id) or "")) is not None,
            "label": labels[s.label] if s and s.label != ABSTAIN else "",
            "precision": s.precision if s else np.nan, "coverage": s.coverage if s else np.nan,
            "fires": s.fires if s else 0, "faults": s.faults if s else 0,
            "parents": len(a.parent_ids),
        })
    table = pd.DataFrame(rows, columns=["id", "name", "agent", "author", "written_by", "generation", "in_pool",
                                        "verdict", "replaced",
                                        "decided_by", "label", "precision", "coverage", "fires", "faults",
                                        "parents"])
    return unique_names(table)


def unique_names(table: pd.DataFrame) -> pd.DataFrame:
    """Two annotators may be given the same name; on screen each gets its own (the later ones: name #2, #3)."""
    if table.empty:
        return table
    nth = table.groupby("name").cumcount()
    table = table.copy()
    table.loc[nth > 0, "name"] = table["name"][nth > 0] + " #" + (nth[nth > 0] + 1).astype(str)
    return table


def annotator_table(store: Store) -> pd.DataFrame:
    """Every annotator ever proposed, with its latest verdict and dev score (one row each)."""
    return _annotator_table(state.workspace_name(), workspace.version(store))


def settled(store: Store, compute: Callable[[], T]) -> T:
    """`compute()`, whose reads of the workspace must agree with each other, done again when the workspace changed
    while it read: another expert labeling a row into dev between the read of the gold labels and the read of the
    votes gave 125 labels against 126 votes, and the Evolve screen an error (bench/team_load.py)."""
    for _ in range(3):
        before = workspace.version(store)
        try:
            found = compute()
        except ValueError:
            if workspace.version(store) == before:
                raise  # a real error, not a change under its feet
            continue
        if workspace.version(store) == before:
            return found
    return compute()


@st.cache_data(show_spinner=False, max_entries=16)
def _pool_votes(name: str, version: tuple, split: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    store = workspace.open_store(name)

    def read() -> tuple[np.ndarray, np.ndarray, list[str]]:
        pool = store.pool_ids()
        return store.vote_matrix(pool, split).votes, store.gold(split), pool

    return settled(store, read)


def pool_votes(store: Store, split: str = "dev") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(votes (n, m), gold (`Store.gold`: (n,) class ids, -1 where unknown; (n, k) sets on a multi-label task), pool
    ids) of the current pool on a split."""
    return _pool_votes(state.workspace_name(), workspace.version(store), split)


@st.cache_data(show_spinner=False, max_entries=16)
def _audit_by_generation(name: str, version: tuple) -> tuple[dict[int, float], dict[int, float], bool, dict[int, int]]:
    store = workspace.open_store(name)
    return settled(store, lambda: _audit_lines(store))


def _audit_lines(store: Store) -> tuple[dict[int, float], dict[int, float], bool, dict[int, int]]:
    task = store.load_task()
    k, audit_gold, fitness_gold = len(task.labels), store.gold(AUDIT), store.gold(FITNESS)
    audit, fitness, partial, sizes = {}, {}, False, {}
    for number in store.generations().query("status == 'complete'")["number"]:
        members = store.pool_ids(int(number))
        sizes[int(number)] = len(members)
        fitness_votes = store.vote_matrix(members, FITNESS).votes
        if not len(audit_gold):  # no audit rows: the fitness rows are all of dev, the figure the metrics show
            fitness[int(number)] = score.pool_macro_f1(fitness_votes, fitness_gold, k)
            continue
        audit_votes = store.vote_matrix(members, AUDIT).votes
        if task.multi_label:
            audit[int(number)] = score.pool_macro_f1(audit_votes, audit_gold, k)
            fitness[int(number)] = score.pool_macro_f1(fitness_votes, fitness_gold, k)
            continue
        audit[int(number)], fitness[int(number)], judged = score.audit_and_fitness_f1(
            audit_votes, audit_gold, fitness_votes, fitness_gold, k)
        partial = partial or not judged.all()
    return audit, fitness, partial, sizes


def audit_by_generation(store: Store) -> tuple[dict[int, float], dict[int, float], bool, dict[int, int]]:
    """Per generation, the pool as it stood then (human verdicts given since count from the generation last complete
    when given) scored on the audit rows ({} without audit rows): the honest line; the same pool on the fitness
    rows as they are now, the line to compare it with (a generation's stored figure may predate verdicts and rows
    added to dev; without audit rows this is the line, so it agrees with Analytics' Pool dev macro-F1); and that pool's
    size (the stored one predates verdicts too). Where the audit rows hold no row of some class, both are over the
    classes they do hold (`score.audit_and_fitness_f1`), and the third value says so."""
    return _audit_by_generation(state.workspace_name(), workspace.version(store))


@st.cache_data(show_spinner=False, max_entries=16)
def _generation_dev_f1(name: str, version: tuple, number: int) -> float:
    store = workspace.open_store(name)
    votes = store.vote_matrix(store.pool_ids(number), FITNESS).votes
    return score.pool_macro_f1(votes, store.gold(FITNESS), len(store.load_task().labels))


def generation_dev_f1(store: Store, number: int) -> float:
    """The pool of generation `number` as it stands now (verdicts since count), scored as the run scored it: majority
    vote on all the fitness rows, every class (the chart's fitness line keeps to the classes the audit rows hold)."""
    return _generation_dev_f1(state.workspace_name(), workspace.version(store), number)


def splits_with_votes(store: Store, splits: tuple[str, ...] = ("dev", "pool")) -> list[str]:
    """Of `splits`, those on which every pool annotator has votes: dev once evolved, pool after labeling (test:
    only when asked for); none for an empty pool."""
    pool = store.pool_ids()
    voted = [set(store.voted_splits(a)) for a in pool]
    return [s for s in splits if voted and all(s in v for v in voted)]


SHORT_NAME = 44  # characters of an annotator's name in a plot (names cut at 28 could not be told apart)


def short(annotator_id: str, names: dict[str, str]) -> str:
    """A readable, unique label for an annotator in plots: its name and the first id characters."""
    name = names.get(annotator_id, "")
    if len(name) > SHORT_NAME:  # its head (label, first cues) and its tail (the rule's kind) tell names apart
        name = f"{name[:SHORT_NAME - 15]}…{name[-14:]}"
    return f"{name} ·{annotator_id[:6]}" if name else annotator_id[:10]


@st.cache_data(show_spinner="Grouping the unlabeled rows…", max_entries=8)
def _weak_spots(name: str, version: tuple, split: str) -> tuple[list, list[str], list[str]]:
    store = workspace.open_store(name)
    votes = store.vote_matrix(store.pool_ids(), split).votes
    frame = store.examples_frame(split)
    spots, _ = weak_spots(votes, list(frame["text"]), len(store.load_task().labels))
    return spots, [str(i) for i in frame["id"]], list(frame["text"])


def weak_spot_groups(store: Store, split: str) -> tuple[list, list[str], list[str]]:
    """(weak spots ranked, row ids, row texts) of a split the whole pool has votes on."""
    return _weak_spots(state.workspace_name(), workspace.version(store), split)


@st.cache_resource(show_spinner="Reading the unlabeled rows…", max_entries=2)
def _pool_likeness(name: str, rows_version: str | None) -> PoolLikeness:
    return PoolLikeness(workspace.open_store(name))


def pool_likeness(store: Store) -> PoolLikeness:
    """The unlabeled rows' TF-IDF for the Labels screen's rows like a wrong one and rows of a class, fitted once per
    state of the rows (seconds on long rows; verdicts and generations leave it be): each rerun, row selected and class
    picked only ranks."""
    return _pool_likeness(state.workspace_name(), store.rows_version())


@st.cache_data(show_spinner=False, max_entries=16)
def _pool_audit_estimate(name: str, version: tuple, number: int | None) -> Estimate | None:
    return pool_audit_estimate(workspace.open_store(name), number)


def pool_audit_sentence(store: Store, number: int | None = None) -> str:
    """The pool's honest figure beside its fitness figure, in a sentence ('' without audit rows): its majority vote
    on the audit rows the gate never saw, with the interval (`engine.evolve.pool_audit_estimate`)."""
    est = _pool_audit_estimate(state.workspace_name(), workspace.version(store), number)
    if est is None:
        return ""
    return (f" On the {est.n_rows} audit rows the agents and the gate never saw, its majority vote scores "
            f"{est.macro_f1:.3f} ({est.level:.0%} interval {est.low:.2f}–{est.high:.2f}): the figure to expect on "
            "new rows.")
