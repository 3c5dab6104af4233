"""The expert's verdicts: candidate cards with the gate's reasons, and approve / reject with a reason."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.domain import THIN_FITNESS_ROWS
from engine.expert import review
from engine.expert.explain import Explanation
from engine.store.workspace import Store
from studio import queries, state, widgets

ICONS = {"accept": ":green[:material/check_circle:]", "approve": ":blue[:material/thumb_up:]",
         "reject": ":red[:material/block:]", "prune": ":orange[:material/content_cut:]",
         "pending": ":gray[:material/hourglass_empty:]"}
VERDICT_SUBMIT = "verdict_submit_"  # + the form's key: True on the run its button was pressed


def verdict_pending() -> bool:
    """Whether this run carries a verdict form's submission (its card must be drawn for it to be read)."""
    return any(k.startswith(VERDICT_SUBMIT) and v is True for k, v in st.session_state.items()
               if isinstance(k, str))


# classes a warning names in its text (600 thin classes filled the screen); the rest go in a table below it
MAX_NAMED_CLASSES = 12


def verdict_form(store: Store, annotator_id: str, in_pool: bool, key: str, decided_by: str) -> None:
    """Approve (or restore) / reject (or disable) with a required reason; logged as a human verdict."""
    action = "Reject" if in_pool else "Approve"
    note_key = f"note_{key}_{annotator_id}"
    with st.form(f"verdict_{key}_{annotator_id}", border=False):
        note = st.text_input("Your reason (logged)", key=note_key,
                             placeholder="e.g. fires on song titles, not spam" if in_pool else "e.g. precise enough")
        clicked = st.form_submit_button(action + (" (take out of the pool)" if in_pool else " (put in the pool)"),
                                        icon=":material/block:" if in_pool else ":material/check_circle:",
                                        key=f"{VERDICT_SUBMIT}{key}_{annotator_id}")
    if clicked:
        if not note.strip():
            st.error("Give a reason: it is logged with your verdict.")
            return
        (review.reject if in_pool else review.approve)(store, annotator_id, note.strip())
        state.put(state.LAST_VERDICT, annotator_id)  # its card stays open: the undo is right there
        annotator = store.annotator(annotator_id)
        shown = queries.escape_md(annotator.name if annotator is not None and annotator.name else annotator_id[:8])
        state.flash(f"{'Rejected' if in_pool else 'Approved'} {shown} — logged with your reason. "
                    "You can undo it any time.")
        st.session_state.pop(note_key, None)  # the form now offers the opposite verdict: not with this reason
        st.rerun()
    if decided_by == "human":  # only an expert's verdict is undone: no log read for every other card
        undo_button(store, annotator_id, key)


def undo_button(store: Store, annotator_id: str, key: str) -> None:
    """When the latest verdict is the expert's: undo it, so the verdict it overrode stands again (the gate's, which
    the gate may revise as before), where the opposite verdict would lock the annotator as the expert's."""
    undoable = store.undoable(annotator_id)  # None: nothing to undo (not the expert's, or their only verdict)
    if undoable is None:
        return
    seq, verdict = undoable
    leaving = review.displaced_by_undo(store, annotator_id)  # its edit (or the version before it) would leave
    label, help_ = f"Undo my {verdict}", ("The verdict yours overrode stands again (the gate's, which later "
                                          "generations may revise); the log keeps both")
    if leaving is not None:
        label = "Restore this version"
        help_ = (f"It comes back in place of {leaving[0][:8]}, which leaves the pool (an annotator and its edit "
                 "would vote on the same rows); the log keeps every step")
    if st.button(label, key=f"undo_{key}_{annotator_id}", icon=":material/undo:", help=help_):
        try:  # the verdict this screen showed, not one another tab gave since
            restored = review.undo(store, annotator_id, "undone in the studio", expected=seq)
        except ValueError as err:
            st.error(str(err))
            return
        state.put(state.LAST_VERDICT, annotator_id)
        left = leaving is not None and restored in ("accept", "approve")  # retired in the undo's transaction
        state.flash(f"Undone: {restored} stands again" + (f"; {leaving[0][:8]} left the pool in its place."
                                                          if left else "."))
        st.rerun()


def candidate_cards(store: Store, generation: int, only: str = "all") -> None:
    """Every gate verdict of a generation as a card: verdict, reasons, scores, code, and the override."""
    verdicts = store.verdicts(generation=generation)
    # one card per annotator: a member the gate accepted in this generation and pruned later as of it (a newcomer
    # from the studio or `pool add` covers it) has two gate verdicts here, and two forms under one key failed the
    # screen (bench/team_load.py); its card shows the later one
    gate = verdicts[verdicts["decided_by"] == "gate"].drop_duplicates("annotator_id", keep="last")
    if gate.empty:
        st.caption("No gate verdicts in this generation.")
        return
    table = queries.annotator_table(store).set_index("id")
    if only != "all":
        gate = gate[gate["verdict"] == only]
    words = review.explain_verdicts(store, gate)
    for row in gate.itertuples():
        info = table.loc[row.annotator_id] if row.annotator_id in table.index else None
        name = info["name"] if info is not None else row.annotator_id
        now = info["verdict"] if info is not None else row.verdict
        overridden = info is not None and info["decided_by"] == "human"
        # the icon is the verdict that stands: the expert's over the gate's
        title = (f"{ICONS.get(now, '')} expert: {now} · {queries.escape_md(name)}" if overridden
                 else f"{ICONS.get(row.verdict, '')} {row.verdict} · {queries.escape_md(name)}")
        if info is not None:
            title += (f" · {info['agent']} · precision {queries.number(info['precision'], '.2f')} · coverage "
                      f"{queries.number(info['coverage'], '.3f')}")
        if overridden:
            title += f" · the gate: {row.verdict}"
        if row.verdict != "accept" and len(row.reasons):
            title += f" — {queries.escape_md(row.reasons[-1])}"  # the decisive reason
        plain = words.get(row.Index)
        if plain is not None and plain.at_chance:
            title += " · :orange[no better than chance]"
        with st.expander(title, expanded=row.annotator_id == state.get(state.LAST_VERDICT)):
            if plain is not None:
                explanation(plain)
            st.markdown("**Gate reasons**")
            st.markdown("\n".join(f"- {queries.escape_md(r)}" for r in row.reasons) or "_none given_")
            annotator = store.annotator(row.annotator_id)
            if annotator is not None:
                if annotator.rationale:
                    st.caption(f"Why the agent wrote it: {queries.escape_md(annotator.rationale)}")
                st.code(annotator.source, language="python")
            history(store, row.annotator_id)
            left, right = st.columns([3, 1])
            with left:
                verdict_form(store, row.annotator_id, info is not None and bool(info["in_pool"]), "card",
                             str(info["decided_by"]) if info is not None else "human")
            with right:
                if st.button("Open in Annotator", key=f"open_{row.annotator_id}", icon=":material/code:"):
                    state.select_annotator(row.annotator_id)
                    st.switch_page("pages/annotator.py", query_params={state.QP_WORKSPACE: state.workspace_name(),
                                                                        state.QP_ANNOTATOR: row.annotator_id})


def explanation(plain: Explanation, decided_in: int | None = None) -> None:
    """The plain-words verdict, and a warning when the precision is no better than the class's share. `decided_in`:
    the generation whose pool the gate's reasons were weighed against, for a verdict of the gate's (its with / without
    figures and overlaps are of that pool, which verdicts since may have changed, not of today's)."""
    when = "" if decided_in is None else (f" (the gate's reasons as it decided in generation {decided_in}, against "
                                          "the pool of then; *Contribution* above is with the pool as it is now)")
    st.markdown(f"**In plain words{when}:** " + " ".join(plain.lines))
    if plain.at_chance:
        st.warning(f"This annotator is right no more often than chance ({plain.chance:.0%} of dev is its class): "
                   "a rule on length or punctuation often looks like this. Its votes add noise, not knowledge; "
                   "reject it unless you know better.", icon=":material/warning:")


def thin_class_note(store: Store) -> None:
    """Which classes have too few dev rows to judge an annotator on, and what the expert can do about it."""
    thin = sorted(review.thin_classes(store), key=lambda item: item[1])  # the thinnest first
    if not thin:
        return
    listed = widgets.name_a_few([f"**{queries.escape_md(label)}** ({rows})" for label, rows in thin],
                                MAX_NAMED_CLASSES, f"classes (all {len(thin):,} listed below)")
    st.warning(f"Too few dev rows to judge annotators of {listed} (the rows the gate judges on; under "
               f"{THIN_FITNESS_ROWS} each): one lucky row moves a precision there by 10% or more, and each "
               "class weighs as much in macro-F1 as the biggest. Label more of them on the **Labels** screen "
               "(*Label rows for dev*: they join dev with your name and the time), import more, describe the class on "
               "the **Project** screen (*Describe a label*: the agents try its words as cues), or judge those "
               "annotators by their fired rows.", icon=":material/warning:")
    widgets.table_of_all(thin, ["class", "dev rows"], MAX_NAMED_CLASSES,
                         f"All {len(thin):,} classes with too few dev rows")


def history(store: Store, annotator_id: str, always: bool = False) -> None:
    """Every verdict on an annotator, oldest first: the gate's and the expert's, with reasons and notes.

    Shown only once an expert has decided, unless `always`."""
    frame = store.verdicts(annotator_id=annotator_id)
    if frame.empty or (not always and not (frame["decided_by"] == "human").any()):
        return
    shown = pd.DataFrame({"when": frame["recorded_at"].astype(str).str[:19], "generation": frame["generation"],
                          "verdict": frame["verdict"],
                          "by": [e if by != "gate" and isinstance(e, str) and e else by
                                 for by, e in zip(frame["decided_by"], frame["expert"], strict=True)],
                          "reason": [n or "; ".join(r) for n, r in zip(frame["note"], frame["reasons"], strict=True)]})
    st.dataframe(shown, hide_index=True)
