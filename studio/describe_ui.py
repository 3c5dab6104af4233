"""Describing the labels after import: the words of a label's description seed the offline agents' cues and go into
the LLM agents' prompts, from their next generation on. For a class with few dev rows its own words stand in for the
cues dev is too small to find (the thin-class note on the review screens points here)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from engine.domain import Task
from engine.markdown import escape_md
from engine.store.workspace import Store
from studio import state


def descriptions_table(store: Store, task: Task) -> None:
    """The labels' descriptions, when any, with who gave each (the import's, when no one has changed it since)."""
    if not task.label_descriptions:
        return
    log = store.description_log()
    latest = {row.label: row for row in log.itertuples()}  # ordered by time: the last one of each label stays
    given = [latest[label].expert if label in latest and latest[label].description == text else "the import"
             for label, text in task.label_descriptions.items()]
    st.dataframe(pd.DataFrame({"label": list(task.label_descriptions), "description":
                               list(task.label_descriptions.values()), "given by": given}), hide_index=True)


@dataclass(frozen=True)
class LastSave:
    """What the last save can undo: in `workspace` only, and while `label` still reads `saved`."""

    workspace: str
    label: str
    previous: str
    saved: str


def _text_key(label: str) -> str:
    """The description box's key, new after each save or undo (`state.new_describe_boxes`)."""
    return f"{state.DESCRIBE_TEXT}{state.get(state.DESCRIBE_VERSION, 0)}_{label}"


def _in_use() -> None:
    state.put(state.DESCRIBE_OPEN, True)


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
        # a form: the box's text travels with the click (a box alone sends it only when it loses focus, so a
        # button enabled by the text took a first click to wake and a second to save)
        with st.form("describe_form", border=False):
            text = st.text_area("Description", value=current, key=_text_key(label),
                                placeholder="blank: no description")
            save = st.form_submit_button("Save description", key="describe_save")
        if save and text.strip() == current.strip():
            state.put(state.DESCRIBE_OPEN, True)
            st.info(f"Nothing to save: that is {escape_md(label)}'s description already.")
        elif save:
            state.put(state.DESCRIBE_OPEN, True)  # open after the rerun: the undo is in it
            previous = store.describe_label(label, text)
            state.put(state.DESCRIBE_UNDO, LastSave(str(store.path), label, previous, text.strip()))
            state.new_describe_boxes()
            state.flash(f"Saved the description of {escape_md(label)}: the agents read it from their next "
                        "generation on.")
            st.rerun()
        undo: LastSave | None = state.get(state.DESCRIBE_UNDO)
        if undo is not None and undo.workspace == str(store.path) and undo.label in task.labels \
                and str(task.label_descriptions.get(undo.label, "")) == undo.saved:
            shown = f"“{undo.previous}”" if undo.previous else "no description"
            if st.button(f"Undo: give {undo.label} {shown} again", key="describe_undo"):
                state.put(state.DESCRIBE_OPEN, True)
                store.describe_label(undo.label, undo.previous)
                state.pop(state.DESCRIBE_UNDO)
                state.new_describe_boxes()
                st.rerun()
