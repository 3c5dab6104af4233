"""The keyboard labeling screen's parts: the queue kept in the session, one label, a skip and an undo."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.apply.executor import default_executor
from engine.expert.queue import suggest_rows, teach
from engine.expert.rows import unlabel_rows
from engine.store.workspace import Store
from studio import editor, state

BATCH = 25  # rows the queue picks at a time: a refill reads the pool afresh, the new dev rows included
NOTE = "labeled on the keyboard (Label rows screen)"


def queue(store: Store, name: str) -> list[dict]:
    """The rows still to label this session, best first; refilled from the engine's queue when it runs dry."""
    held = st.session_state.get(state.TEACH_QUEUE)
    if held is None or held[0] != name or not held[1]:
        skipped = set(st.session_state.get(state.TEACH_SKIPPED, ()))
        with st.spinner("Picking the rows worth your label…"), default_executor() as executor:
            rows = [s.to_dict() for s in suggest_rows(store, executor, BATCH, exclude=skipped)]
        held = (name, rows)
        st.session_state[state.TEACH_QUEUE] = held
    return held[1]


def done() -> list[tuple[str, str]]:
    return list(st.session_state.get(state.TEACH_DONE, []))


def label(store: Store, row: dict, label_name: str, who: str) -> None:
    """The row joins dev with this label (who and when recorded); it leaves the queue."""
    with editor.sandbox() as executor:  # a warm sandbox of the server's: a new executor per key press cost seconds
        teach(store, executor, {row["id"]: label_name}, who, NOTE)
    st.session_state[state.TEACH_DONE] = [*done(), (row["id"], label_name)]
    _drop(row["id"])


def skip(row: dict) -> None:
    st.session_state[state.TEACH_SKIPPED] = [*st.session_state.get(state.TEACH_SKIPPED, []), row["id"]]
    _drop(row["id"])


def undo(store: Store) -> str | None:
    """The last label taken back: the row returns to the unlabeled pool and to the front of the queue."""
    history = done()
    if not history:
        return None
    example_id, _ = history[-1]
    unlabel_rows(store, [example_id])
    st.session_state[state.TEACH_DONE] = history[:-1]
    name, rows = st.session_state.get(state.TEACH_QUEUE) or (state.workspace_name(), [])
    frame = store.examples_frame("pool", ids=[example_id])
    if len(frame):
        back = {"id": example_id, "text": str(frame["text"].iloc[0]), "why": "taken back (undo)", "score": 0.0}
        st.session_state[state.TEACH_QUEUE] = (name, [back, *rows])
    return example_id


def _drop(example_id: str) -> None:
    name, rows = st.session_state.get(state.TEACH_QUEUE) or ("", [])
    st.session_state[state.TEACH_QUEUE] = (name, [r for r in rows if r["id"] != example_id])


def votes_on(store: Store, example_id: str, labels: tuple[str, ...]) -> pd.DataFrame:
    """The pool's votes on one row: which annotator says which label (abstentions left out)."""
    pool = store.pool_ids()
    if not pool:
        return pd.DataFrame(columns=["annotator", "says"])
    votes = store.vote_matrix(pool, example_ids=[example_id]).votes
    names = {a.id: a.name for a in store.annotators(pool)}
    said = [(names.get(a, a), labels[v]) for a, v in zip(pool, votes[0], strict=True) if v >= 0] if len(votes) else []
    return pd.DataFrame(said, columns=["annotator", "says"])


def counts_since(store: Store, labels: tuple[str, ...]) -> pd.DataFrame:
    """Per class: the rows labeled on this screen this session, and the fitness rows dev holds now."""
    from engine.expert.review import class_rows

    now = class_rows(store)
    added = pd.Series([lbl for _, lbl in done()], dtype=object).value_counts()
    return pd.DataFrame({"class": list(labels), "labeled here": [int(added.get(lbl, 0)) for lbl in labels],
                         "dev rows now": [now[lbl] for lbl in labels]})
