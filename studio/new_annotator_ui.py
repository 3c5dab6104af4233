"""Write a new annotator from scratch in the studio: the gate weighs it against the pool, as `evopool pool add` does.

The Evolve screen advises writing an annotator yourself when generations stall, but the Annotator screen only edited
existing ones, and saving an edit retires its parent. This form submits a fresh one: checked, run on
dev in the sandbox, judged by the gate against today's pool, and saved only when the gate accepts it or the expert
adds it over the gate's rejection, with their reason logged.
"""
from __future__ import annotations

import streamlit as st

from engine.domain import Task
from engine.expert import review
from engine.expert.explain import why_the_verdict
from engine.markdown import code_span, escape_md
from engine.store.workspace import Store
from studio import editor, state

NEW_RESULT = state.NEW_ANNOTATOR  # (source, name, review.submit's answer): dropped when another workspace opens
NEW_SOURCE, NEW_NAME, NEW_OVERRIDE = "new_source", "new_name", "new_override"


def starter(task: Task) -> str:
    """A skeleton naming the task's first label and text field, for the expert to fill in."""
    label = task.labels[0] if task.labels else "LABEL"
    return ('def annotate(example):\n    """What this rule looks for."""\n'  # a label may hold any quote: repr only
            '    text = example["text"].lower()\n'
            f'    if {"a word of " + label.lower()!r} in text:\n'
            f'        return {label!r}\n'
            '    return None  # abstain\n')


def new_annotator_form(store: Store) -> None:
    """The form, and the gate's answer to the last submission (with "add it anyway" after a rejection)."""
    task = store.load_task()
    with st.form("new_annotator", border=False):
        source = st.text_area("Code", starter(task), height=220, key=NEW_SOURCE,
                              help="def annotate(example) returning a label, or None to abstain; example holds "
                                   f"{', '.join(code_span(f) for f in ('text', *task.fields))}")
        name = st.text_input("Name", key=NEW_NAME, placeholder="e.g. SPAM: asks to subscribe")
        submitted = st.form_submit_button("Ask the gate", icon=":material/gavel:")
    if submitted:
        with st.spinner("Running it on dev in the sandbox and asking the gate…"), editor.sandbox() as executor:
            answer = review.submit(store, executor, source, name=name.strip(), via="the studio's new-annotator form")
        state.put(NEW_RESULT, (source, name.strip(), answer))
    held = state.get(NEW_RESULT)
    if held is None:
        return
    source, name, answer = held
    _answer(store, source, name, answer)


def _answer(store: Store, source: str, name: str, answer: dict) -> None:
    reasons = "; ".join(escape_md(r) for r in answer.get("reasons") or [] if r)
    if answer["verdict"] == "refused":
        st.error(f"Not run: {reasons}")
        return
    if answer["verdict"] == "in pool":
        st.info(reasons)
        return
    figures = (f"precision {answer['precision']:.2f} over {answer['fires']} dev fires"
               + (f", faults on {answer['faults']} rows, first: {escape_md(answer.get('first_error') or '')}"
                  if answer.get("faults") else ""))
    if answer["added"]:
        pruned = len(answer.get("pruned") or [])
        st.success(f"The gate accepted **{escape_md(answer['name'])}** ({figures}) and it joined the pool"
                   + (f"; it replaces {pruned} member{'s' if pruned != 1 else ''} it covers" if pruned else "")
                   + f". Pool dev macro-F1 {answer['dev_macro_f1']:.3f}.")
        if st.button("Open it", key="new_open"):
            state.pop(NEW_RESULT)
            state.select_annotator(answer["id"])
            st.rerun()
        return
    # the check that failed, in plain words (the raw reasons listed every check, the passing ones first)
    names = {a.id: escape_md(a.name or a.id[:8]) for a in store.annotators()}
    words = " ".join(why_the_verdict(answer["verdict"], answer.get("reasons") or [], "gate", names))
    st.warning(f"The gate rejected it ({figures}). {words}")
    with st.expander("The gate's reasons, as it gave them"):
        st.markdown(reasons)
    # code that only faults would sit in the pool labeling nothing: adding it takes a second yes, as saving an edit does
    broken = not answer.get("fires") and bool(answer.get("faults"))
    with st.form("new_override_form", border=False):
        note = st.text_input("Add it anyway: your reason (logged)", key=NEW_OVERRIDE)
        anyway = broken and st.checkbox(f"Add it although it faults on {answer['faults']:,} dev rows and votes on none",
                                        key=f"new_broken_{answer['id']}")  # a tick for this code only
        if st.form_submit_button("Add it over the gate"):
            if not note.strip():
                st.error("Give a reason: it is logged with the annotator.")
                return
            if broken and not anyway:
                st.error("Not added: it faults and never votes. Fix the fault (above), or tick the box to add it "
                         "anyway.")
                return
            with editor.sandbox() as executor:
                added = review.submit(store, executor, source, name=name, approve_anyway=True,
                                      via=f"the studio's new-annotator form ({note.strip()})")
            state.pop(NEW_RESULT)
            state.select_annotator(added["id"])
            state.flash(f"Added {escape_md(added['name'])} to the pool"
                        + (" over the gate's rejection." if added.get("approved_over_gate") else
                           ": the gate accepted it this time (the pool had changed)."))
            st.rerun()
