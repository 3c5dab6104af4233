"""Pieces of the Annotator screen: picking one, its numbers before vs after an edit, where it fires, lineage."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from engine.apply.votes import ensure_votes
from engine.domain import FITNESS, Annotator, AnnotatorScore
from engine.expert import review
from engine.metrics.score import pool_macro_f1
from engine.sandbox.annotators import docstring_title
from engine.specs.templates import parse_spec
from engine.store.workspace import Store
from studio import editor, queries, state

FIRED_PAGE = 10


def pick(store: Store, table: pd.DataFrame) -> str | None:
    """A selectbox over every annotator (the pool first); remembers the choice in the session and URL."""
    if table.empty:
        return None
    ordered = pd.concat([table[table["in_pool"]], table[~table["in_pool"]]])
    ids = ordered["id"].tolist()
    labels = {r.id: f"{'● ' if r.in_pool else '○ '}{r.name} · {'replaced' if r.replaced else r.verdict} · "
                    f"gen {r.generation} · {r.id[:8]}"
              for r in ordered.itertuples()}
    current = state.annotator_id()
    if current not in ids:  # none chosen yet: keep the one shown, so a verdict that reorders the list keeps it here
        current = ids[0]
        state.select_annotator(current)
    if st.session_state.get(state.PICK_ANNOTATOR) != current:  # chosen elsewhere: a link, a plot, a save
        st.session_state[state.PICK_ANNOTATOR] = current
    st.selectbox("Annotator (● in the pool, ○ not)", ids, format_func=labels.get, key=state.PICK_ANNOTATOR,
                 on_change=lambda: state.select_annotator(st.session_state[state.PICK_ANNOTATOR]))
    return current


def dev_votes(store: Store, annotator_id: str) -> np.ndarray:
    """The annotator's dev votes, running it in the sandbox first if they were never stored."""
    if "dev" not in store.voted_splits(annotator_id):
        with editor.sandbox() as executor:
            ensure_votes(store, executor, [annotator_id], "dev")
    return store.vote_matrix([annotator_id], FITNESS).votes[:, 0]


def contribution(store: Store, annotator_id: str, votes: np.ndarray) -> float:
    """Pool dev macro-F1 with this annotator minus without it (whether or not it is in the pool now)."""
    k = len(store.load_task().labels)
    y = store.gold(FITNESS)  # label sets on a multi-label task
    others = [a for a in store.pool_ids() if a != annotator_id]
    base = store.vote_matrix(others, FITNESS).votes
    with_it = np.column_stack([base, votes]) if base.size else votes[:, None]
    return pool_macro_f1(with_it, y, k) - pool_macro_f1(base, y, k)


def score_table(before: AnnotatorScore | None, before_contribution: float | None, after: AnnotatorScore | None,
                after_contribution: float | None) -> pd.DataFrame:
    """Precision, coverage, fires and contribution side by side (before = saved version, after = edit)."""
    def column(s: AnnotatorScore | None, c: float | None) -> list:
        if s is None:
            return [None, None, None, None, None]
        return [round(s.precision, 3), round(s.coverage, 4), s.fires, s.faults,
                None if c is None else round(c, 4)]

    return pd.DataFrame({"measure": ["precision", "coverage", "fires", "faults", "contribution (Δ macro-F1)"],
                         "saved version": column(before, before_contribution),
                         "your edit": column(after, after_contribution)})


def fired_examples(fired: pd.DataFrame, needles: list[str], key: str) -> None:
    """The dev rows it fires on, wrong ones first, the words that made it fire highlighted; paged."""
    if fired.empty:
        st.caption("It fires on no dev row.")
        return
    wrong = int((~fired["correct"]).sum())
    st.caption(f"Fires on {len(fired)} dev rows: {wrong} wrong, {len(fired) - wrong} right (wrong ones first).")
    pages = max(1, -(-len(fired) // FIRED_PAGE))
    page = st.number_input(f"Page (of {pages})", 1, pages, 1, key=f"fired_page_{key}") if pages > 1 else 1
    part = fired.iloc[(int(page) - 1) * FIRED_PAGE: int(page) * FIRED_PAGE]
    for row in part.itertuples():
        mark = ":green[:material/check:]" if row.correct else ":red[:material/close:]"
        st.markdown(f"{mark} gold **{queries.escape_md(row.label)}** · vote **{queries.escape_md(row.vote)}** — "
                    + editor.highlighted(str(row.text), needles))


def lineage(store: Store, annotator: Annotator) -> pd.DataFrame:
    """Ancestors (parents, their parents…) and descendants across generations, with their current verdict."""
    latest = store.latest_verdicts()
    rows, seen = [], {annotator.id}

    def add(a: Annotator, relation: str) -> None:
        rows.append({"relation": relation, "generation": a.generation, "name": a.name, "agent": a.agent,
                     "author": a.author, "written_by": a.provenance,
                     "verdict": latest.get(a.id, ("pending", ""))[0], "id": a.id})

    frontier, depth = list(annotator.parent_ids), 1
    while frontier and depth <= 10:
        parents = [p for p in store.annotators([i for i in frontier if i not in seen])]
        for p in parents:
            seen.add(p.id)
            add(p, "parent" if depth == 1 else f"ancestor ({depth} up)")
        frontier, depth = [i for p in parents for i in p.parent_ids], depth + 1
    frontier, depth = [annotator.id], 1
    while frontier and depth <= 10 and len(rows) < 100:
        children = [c for i in frontier for c in store.children_of(i) if c.id not in seen]
        for c in children:
            seen.add(c.id)
            add(c, "child" if depth == 1 else f"descendant ({depth} down)")
        frontier, depth = [c.id for c in children], depth + 1
    return pd.DataFrame(rows, columns=["relation", "generation", "name", "agent", "author", "written_by", "verdict",
                                       "id"])


def edit_name(source: str, parent: Annotator) -> str:
    """The name an edited version starts with: the parent's while the edit checks what the parent's name says,
    else what an unedited template of the edit would be called ("SPAM: check*, subscribe* [sentence]"), so two
    versions that check different cues do not share a name. Free-form code keeps the parent's name unless its
    docstring's first line, which names it, was changed ("ABBR: ..." for an edit that now votes ABBR kept the
    parent's "HUM: ..." before)."""
    edited, original = parse_spec(source), parse_spec(parent.source)
    if edited is None:
        title = docstring_title(source)
        return title if title and title != docstring_title(parent.source) else parent.name
    if original is not None and edited.title() == original.title():
        return parent.name
    return edited.title()


def preview(store: Store, source: str, parent_id: str) -> review.EditPreview:
    with st.spinner("Running your edit on dev in the sandbox…"), editor.sandbox() as executor:
        return review.preview_edit(store, executor, source, parent_id)
