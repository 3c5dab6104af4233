"""Annotator: read and edit one annotator's code, re-score it on dev, save a new version, see its lineage."""
import streamlit as st

from engine.expert import explain, review
from engine.sandbox.checks import CodeRejected
from studio import annotator_ui, editor, new_annotator_ui, queries, review_ui, state, widgets

widgets.header("Annotator", "read, edit and re-score one annotator")
store = widgets.require_data()
table = queries.annotator_table(store)
annotator_id = annotator_ui.pick(store, table)
annotator = store.annotator(annotator_id) if annotator_id else None
# open while the gate's answer to the last one is shown: it closed on that answer and hid it
with st.expander("Write a new annotator", icon=":material/add:",
                 expanded=annotator is None or state.get(new_annotator_ui.NEW_RESULT) is not None):
    new_annotator_ui.new_annotator_form(store)
if annotator is None:
    st.info("No annotators yet: write one above, or run a generation on **Evolve**.")
    st.page_link("pages/evolve.py", label="Go to Evolve", icon=":material/science:")
    st.stop()

info = table.set_index("id").loc[annotator.id]
task = store.load_task()
votes = annotator_ui.dev_votes(store, annotator.id)
saved_score = store.scores([annotator.id]).get(annotator.id)
saved_contribution = annotator_ui.contribution(store, annotator.id, votes)

last_verdict = store.verdicts(annotator_id=annotator.id).tail(1)
# a version retired for its edit reads "replaced", not "reject": nobody rejected it
replaced_by = review.replaced_by(str(last_verdict["note"].iloc[0])) if not last_verdict.empty else None
cols = st.columns(6)
cols[0].metric("Verdict", "replaced" if info["verdict"] == "reject" and replaced_by else info["verdict"],
               help=f"retired for its edited version {replaced_by[:8]}" if info["verdict"] == "reject" and replaced_by
               else f"decided by {info['decided_by'] or 'nobody yet'}")
cols[1].metric("Precision (dev)", queries.number(info["precision"], ".2f"))
cols[2].metric("Coverage (dev)", queries.number(info["coverage"], ".3f"))
cols[3].metric("Fires", int(info["fires"]))
cols[4].metric("Contribution", f"{saved_contribution:+.4f}", help="pool dev macro-F1 with it minus without it")
cols[5].metric("Generation", int(annotator.generation), help=f"{annotator.agent}, written by {annotator.provenance}")
if annotator.rationale:
    st.caption(f"Why it was written: {queries.escape_md(annotator.rationale)}")
if not last_verdict.empty:
    # the gate's reasons are dated: verdicts given since may have changed the pool the contribution reads
    review_ui.explanation(review.explain_verdicts(store, last_verdict)[last_verdict.index[0]],
                          review.gate_decided_in(store, last_verdict.iloc[0]))
for label, rows in review.thin_classes(store, votes):
    st.warning(explain.too_few_rows(queries.escape_md(label), rows), icon=":material/warning:")

code_col, side_col = st.columns([3, 2])
with code_col:
    st.subheader("Code")
    source = editor.code_editor(annotator.source, key=annotator.id, store=store)
    editor.containment_note()
    changed = source.strip() != annotator.source.strip()
    # never disabled: a plain text box sends its text with the click, so a button enabled by the text took a first
    # click to wake and a second to re-score
    rescore = st.button("Re-score on dev", icon=":material/speed:", key="rescore",
                        help="run the edited code on the dev split in the sandbox")
    if rescore and not changed:
        st.info("Nothing to re-score: the code is the saved version's. Edit it first (in the code editor, press "
                "**Apply** or Ctrl+Enter before re-scoring).")
    elif rescore:
        state.put(state.EDIT_PREVIEW, (annotator.id, source, annotator_ui.preview(store, source, annotator.id)))
        state.pop("edit_name")  # the name box starts from what this edit now checks (`annotator_ui.edit_name`)
    held = state.get(state.EDIT_PREVIEW)
    result = held[2] if held and held[0] == annotator.id and held[1] == source else None
    if result is not None and result.error and result.annotator is None:
        st.error(f"The edited code was refused: {queries.escape_md(result.error)}")
    elif result is not None:
        if result.error:
            st.warning(f"It ran, with faults: {queries.escape_md(result.error)}")
        if result.annotator.id == annotator.id:
            st.info("This is the same code once normalised (comments and layout do not count): nothing to save.")
        st.markdown("**Saved version vs your edit** (on dev)")
        st.dataframe(annotator_ui.score_table(saved_score, saved_contribution, result.score, result.contribution),
                     hide_index=True)
        # a version that only faults would take a working one's place in the pool: saving it takes a second yes
        broken = result.score is not None and result.score.fires == 0 and result.score.faults > 0
        with st.form("save_edit", border=False):
            note = st.text_input("What did you change, and why? (logged)", key="edit_note")
            new_name = st.text_input("Name of the new version", value=annotator_ui.edit_name(source, annotator),
                                     key="edit_name",
                                     help="say what it now does if the edit changed its cues (the name is on "
                                          "every screen and in the export)")
            anyway = broken and st.checkbox(
                f"Save it although it faults on {result.score.faults:,} dev rows and votes on none", key="edit_broken",
                help="it would replace the saved version in the pool and label nothing")
            if st.form_submit_button("Save as a new version", type="primary", icon=":material/save:"):
                if broken and not anyway:  # the rest of the screen still draws: the expert decides with it
                    st.error("Not saved: the edit faults and never votes. Fix the fault (see above) or tick the box to "
                             "save it anyway.")
                else:
                    try:
                        parent_in_pool = annotator.id in store.pool_ids()
                        with editor.sandbox() as executor:
                            saved = review.save_edit(store, executor, source, annotator.id,
                                                     note.strip() or "edited by hand", name=new_name.strip())
                        editor.drop_draft(annotator.id, store)  # saved: the old version opens as it is
                        state.select_annotator(saved.id)
                        state.flash(f"Saved as a new version {saved.id[:8]} (parent {annotator.id[:8]}); it is in the "
                                    "pool" + (" and the old version was retired (its \"Restore this version\" button "
                                              "swaps them back)." if parent_in_pool
                                              else "; the old version was not in it and stays out."))
                        st.rerun()
                    except CodeRejected as err:
                        st.error(f"Not saved: {queries.escape_md(err.reason)}")
    elif changed:
        st.caption("You changed the code: **Re-score on dev** to compare it with the saved version.")

with side_col:
    st.subheader("In the pool?")
    review_ui.verdict_form(store, annotator.id, bool(info["in_pool"]), "annotator", str(info["decided_by"]))
    review_ui.history(store, annotator.id, always=True)
    st.subheader("Lineage")
    family = annotator_ui.lineage(store, annotator)
    if family.empty:
        st.caption("No parents or children: an original.")
    else:
        picked = st.dataframe(family.drop(columns=["id"]), hide_index=True, on_select="rerun",
                              selection_mode="single-row", key=f"lineage_{annotator.id}")
        st.caption("Select a row to open that version.")
        if picked.selection.rows:
            state.select_annotator(family.iloc[picked.selection.rows[0]]["id"])
            st.rerun()

edit_shown = result is not None and result.annotator is not None
st.subheader("Where your edit fires on dev" if edit_shown else "Where it fires on dev")
if edit_shown:
    st.caption("The rows of the edit you re-scored; the figures at the top are the saved version's.")
needles = editor.cue_words(source, set(task.labels) | set(task.fields))
fired = result.fired_rows if edit_shown else review.fired_rows(store, votes)
annotator_ui.fired_examples(fired, needles, annotator.id)
