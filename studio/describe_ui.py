"""Describing the labels after import: the words of a label's description seed the offline agents' cues and go into
the LLM agents' prompts, from the next generation on. For a class with few dev rows its own words stand in for the
cues dev is too small to find (the thin-class note on the review screens points here)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.store.workspace import Store
from studio import state


def descriptions_table(store: Store) -> None:
    """The labels' descriptions, when any."""
    task = store.load_task()
    if task.label_descriptions:
        st.dataframe(pd.DataFrame(list(task.label_descriptions.items()), columns=["label", "description"]),
                     hide_index=True)


def describe_labels(store: Store) -> None:
    """Pick a label, write what it means, save; the last save can be undone."""
    task = store.load_task()
    with st.expander("Describe a label", icon=":material/edit_note:"):
        st.caption("What the label means, in the words its rows use (\"an allosteric or otherwise indirect "
                   "modulator of the protein\"). The offline agents try the first words of the name and the "
                   "description as cues, the LLM agents read it in their prompt; both from the next generation on. "
                   "Worth most for a class with few dev rows.")
        label = st.selectbox("Label", task.labels, key="describe_label")
        current = str(task.label_descriptions.get(label, ""))
        text = st.text_area("Description", value=current, key=f"describe_text_{label}",
                            placeholder="blank: no description")
        if st.button("Save description", key="describe_save", disabled=text.strip() == current.strip()):
            state.put(state.DESCRIBE_UNDO, (label, store.describe_label(label, text)))
            state.flash(f"Saved the description of {label}: the agents read it from the next generation on.")
            st.rerun()
        undo = state.get(state.DESCRIBE_UNDO)
        if undo is not None and undo[0] in task.labels:
            shown = f"“{undo[1]}”" if undo[1] else "no description"
            if st.button(f"Undo: give {undo[0]} {shown} again", key="describe_undo"):
                store.describe_label(*undo)
                state.pop(state.DESCRIBE_UNDO)
                st.rerun()
