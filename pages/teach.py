"""Label rows: the rows worth the expert's label, one at a time, on the keyboard (number keys, S to skip, U to undo)."""

import streamlit as st

from engine.markdown import escape_md
from studio import labels_ui, state, teach_ui, widgets

KEYS = "123456789"  # a label's key; labels past the ninth are picked from a list

widgets.header("Label rows", "the rows worth your label, one at a time: number keys label, S skips, U undoes")
store = widgets.require_data()
task = store.load_task()
if task.multi_label:
    st.info("On a multi-label task, label rows into dev from the **Labels & export** screen (a row takes several "
            "labels there).")
    st.stop()
name = state.workspace_name()
state.show_flash()

who = st.text_input("Your name (recorded with every label)", value=state.kept(state.EXPERT_NAME, ""),
                    key="teach_who", placeholder="e.g. J. Curator")
if who.strip():
    state.keep(state.EXPERT_NAME, who.strip())

rows = teach_ui.queue(store, name)
done = teach_ui.done()
left, right = st.columns([3, 2])
with right:
    st.metric("Labeled here this session", len(done))
    st.dataframe(teach_ui.counts_since(store, task.labels), hide_index=True)
    saved = labels_ui.saved(name, "auto")
    if saved is not None and saved.dev_scores.estimate is not None:
        st.caption(f"Soft labels (auto) as last computed: {saved.dev_scores.estimate.sentence(task.labels)}. "
                   "Recompute them on **Labels & export** to see what these labels changed.")
if not rows:
    left.success("No unlabeled row left to suggest." if not store.count_examples("pool") else
                 "Every suggested row is labeled or skipped: the next batch is picked on the next run.")
    st.session_state.pop(state.TEACH_QUEUE, None)
    st.stop()

row = rows[0]
with left:
    st.caption(f"Row {escape_md(row['id'])} · picked because {escape_md(row['why'])}")
    with st.container(border=True):
        st.text(row["text"])  # plain text: never markdown or HTML from the data
    votes = teach_ui.votes_on(store, row["id"], task.labels)
    if votes.empty:
        st.caption("No annotator of the pool votes on this row.")
    else:
        st.dataframe(votes, hide_index=True, height=min(35 * (len(votes) + 1) + 3, 200))

buttons = st.columns(min(len(task.labels), len(KEYS)) + 2)
picked = None
for i, label in enumerate(task.labels[:len(KEYS)]):
    if buttons[i].button(f"{KEYS[i]} · {label}", key=f"teach_label_{i}", shortcut=KEYS[i],
                         disabled=not who.strip(), width="stretch"):
        picked = label
if len(task.labels) > len(KEYS):
    more = st.selectbox("More labels", task.labels[len(KEYS):], key="teach_more")
    if st.button("Label as this (Enter)", key="teach_label_more", shortcut="Enter", disabled=not who.strip()):
        picked = more
if buttons[-2].button("S · skip", key="teach_skip", shortcut="S", width="stretch"):
    teach_ui.skip(row)
    st.rerun()
if buttons[-1].button("U · undo", key="teach_undo", shortcut="U", disabled=not done, width="stretch"):
    taken = teach_ui.undo(store)
    state.flash(f"Took back the label of row {taken}: it is unlabeled again and first in the queue.", "info")
    st.rerun()
if not who.strip():
    st.warning("Type your name first: every label is recorded with who gave it.")
if picked is not None:
    try:
        teach_ui.label(store, row, picked, who.strip())
    except ValueError as err:  # the row was labeled elsewhere meanwhile, or a label changed: said, nothing written
        state.flash(f"Not recorded: {err}", "warning")  # shown after the rerun (an st.error was gone before it showed)
        teach_ui.skip(row)
    st.rerun()
