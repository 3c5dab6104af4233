"""Describing the labels after import: the words of a label's description seed the offline agents' cues and go into
the LLM agents' prompts, from their next generation on. For a class with few dev rows its own words stand in for the
cues dev is too small to find (the thin-class note on the review screens points here)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.domain import Task
from engine.store.workspace import Store
from studio import state


def descriptions_table(task: Task) -> None:
    """The labels' descriptions, when any."""
    if task.label_descriptions:
        st.dataframe(pd.DataFrame(list(task.label_descriptions.items()), columns=["label", "description"]),
                     hide_index=True)


def _text_key(label: str) -> str:
    """The description box's key, new after each save or undo: a fresh widget shows what is stored (deleting a
    widget's state does not reach the browser, which would send the old draft back)."""
    return f"{state.DESCRIBE_TEXT}{state.get(state.DESCRIBE_VERSION, 0)}_{label}"


def _in_use() -> None:
    state.put(state.DESCRIBE_OPEN, True)


def _fresh_boxes() -> None:
    state.put(state.DESCRIBE_VERSION, state.get(state.DESCRIBE_VERSION, 0) + 1)


def describe_labels(store: Store, task: Task) -> None:
    """Pick a label, write what it means, save; the last save can be undone while it stands."""
    # open once in use: the browser folded it on the rerun that choosing a label makes
    with st.expander("Describe a label", icon=":material/edit_note:", expanded=bool(state.get(state.DESCRIBE_OPEN))):
        st.caption("What the label means, in the words its rows use (\"an allosteric or otherwise indirect "
                   "modulator of the protein\"). The offline agents try the first words of the name and the "
                   "description as cues, the LLM agents read it in their prompt; both from their next generation "
                   "on. Worth most for a class with few dev rows.")
        label = st.selectbox("Label to describe", task.labels, key="describe_label", on_change=_in_use)
        current = str(task.label_descriptions.get(label, ""))
        text = st.text_area("Description", value=current, key=_text_key(label), placeholder="blank: no description",
                            on_change=_in_use)
        if st.button("Save description", key="describe_save", disabled=text.strip() == current.strip()):
            previous = store.describe_label(label, text)
            state.put(state.DESCRIBE_UNDO, (str(store.path), label, previous, text.strip()))
            _fresh_boxes()
            state.flash(f"Saved the description of {label}: the agents read it from their next generation on.")
            st.rerun()
        undo = state.get(state.DESCRIBE_UNDO)
        # only in the workspace saved in, and only while that save still stands
        if undo is not None and undo[0] == str(store.path) and undo[1] in task.labels \
                and str(task.label_descriptions.get(undo[1], "")) == undo[3]:
            _, undo_label, previous, _ = undo
            shown = f"“{previous}”" if previous else "no description"
            if st.button(f"Undo: give {undo_label} {shown} again", key="describe_undo"):
                store.describe_label(undo_label, previous)
                state.pop(state.DESCRIBE_UNDO)
                _fresh_boxes()
                st.rerun()
