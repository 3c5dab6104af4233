"""The labels screen's rows for dev: the dev rows the labels get wrong (a regression list), unlabeled rows like one
of them or likely of a chosen class, and labeling those rows into dev (who and when recorded), so the classes the
labels miss, and those too thin to judge an annotator on, grow."""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import streamlit as st

from engine.domain import AUDIT, FITNESS, THIN_FITNESS_ROWS
from engine.expert import review
from engine.expert.rows import RowsLeftInDev, label_rows, regression_rows, rows_of_class, similar_rows, unlabel_rows
from engine.store.saved_labels import LABELS_DIR, SavedLabels
from engine.store.workspace import Store
from studio import editor, queries, state, widgets

NOT_LABELED = "(leave unlabeled)"


def regression_list(store: Store, result: SavedLabels) -> pd.DataFrame:
    wrong = regression_rows(store, result.example_ids, result.probs, result.hard)
    st.subheader("Dev rows it gets wrong (regression list)")
    dev = store.count_examples(FITNESS)
    held = store.count_examples(AUDIT)
    st.caption(f"{len(wrong)} of {dev} dev rows" + (f" (the {held} audit rows held back to check the pool are not "
                                                    "listed)" if held else "")
               + f": {result.aggregator}'s out-of-fold label (from a model that never "
               "saw the row's gold label) is not yours. Most confident mistakes first. Select one to find unlabeled "
               "rows like it and label them: they join dev, so the next generation and the aggregators learn from "
               "them.")
    if wrong.empty:
        st.success("It gets every dev row right.")
    return wrong


def label_like(store: Store, wrong: pd.DataFrame, labels: tuple[str, ...], multi_label: bool = False) -> None:
    """The regression table; for the selected row, unlabeled rows like it in an editor with a label column (a label
    set per row on a multi-label task)."""
    if wrong.empty:
        return
    # keyed by the list itself: a selection is a position, which must not carry over to another list (another
    # aggregator, a recompute, rows added to dev) where it names another row or none
    listed = hashlib.sha1("\n".join(map(str, wrong["id"])).encode()).hexdigest()[:12]
    picked = st.dataframe(wrong, hide_index=True, on_select="rerun", selection_mode="single-row",
                          key=f"regression_table_{listed}", column_config={
                              "confidence": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0,
                                                                            format="%.2f")})
    if not picked.selection.rows:
        return
    row = wrong.iloc[picked.selection.rows[0]]
    like = similar_rows(store, row["text"], likeness=queries.pool_likeness(store))
    st.markdown(f"**Unlabeled rows like {queries.code_span(row['id'])}** (gold *{queries.escape_md(row['gold'])}*, "
                f"labeled *{queries.escape_md(row['predicted'])}*)")
    if like.empty:
        st.caption("No unlabeled row is left: every row is labeled." if not store.count_examples("pool") else
                   "No unlabeled row shares its words.")
        return
    _label_form(store, like, labels, multi_label, form_key="label_like", editor_key=f"like_{row['id']}",
                who_key=state.EXPERT_NAME, submit="Add the labeled rows to dev",
                note=f"like dev row {row['id']} ({row['gold']}, labeled {row['predicted']})")


def label_rows_for_dev(store: Store, labels: tuple[str, ...], multi_label: bool, result: SavedLabels | None) -> None:
    """Unlabeled rows likely of a class the expert picks (the thinnest first), to label into dev: how a class with
    too few dev rows to judge its annotators grows (the advice the gate's verdicts and the Evolve screen give)."""
    counts = review.class_rows(store)
    order = sorted(range(len(labels)), key=lambda c: (counts[labels[c]], c))
    st.subheader("Label rows for dev")
    st.caption("Pick a class: the unlabeled rows most likely to be of it are listed, for you to label. They join dev "
               f"with your name and the time. Classes with fewer than {THIN_FITNESS_ROWS} dev rows come first: there "
               "one row more or less right moves an annotator's precision by 10% or more.")

    def named(c: int) -> str:
        thin = ", too few to judge an annotator" if counts[labels[c]] < THIN_FITNESS_ROWS else ""
        return f"{labels[c]} ({counts[labels[c]]} dev row{'' if counts[labels[c]] == 1 else 's'}{thin})"

    # keyed by the counts it shows: a row labeled or returned redraws it (its shown count went stale), on the class
    # the expert had picked
    picked = state.kept(state.GROW_CLASS, order[0])
    chosen = st.selectbox("Find unlabeled rows of", order, format_func=named,
                          index=order.index(picked) if picked in order else 0,
                          key=f"{state.GROW_CLASS}_{hashlib.sha1(repr(counts).encode()).hexdigest()[:8]}")
    state.keep(state.GROW_CLASS, chosen)
    rows = rows_of_class(store, chosen, saved=None if result is None else (result.example_ids, result.probs),
                         likeness=queries.pool_likeness(store) if result is None else None)
    label = queries.escape_md(labels[chosen])  # shown in markdown captions
    raw_label = labels[chosen]
    if rows.empty:
        st.caption("Every row of this workspace is labeled: there are no unlabeled rows to find. (Rows come in with "
                   "a new workspace; `evopool label` labels new data with this pool.)"
                   if not store.count_examples("pool") else
                   f"No unlabeled row shares a word with {label}'s dev rows or its name: compute soft labels to rank "
                   "the rows by the model instead, or describe the class in its own words (Project screen).")
        return
    if result is None:
        st.caption(f"Ranked by how many words they share with {label}'s dev rows (or, with none, its name and "
                   "description). Compute soft labels to rank them by the model's probability of the class instead.")
    else:
        st.caption(f"Ranked by the saved soft labels' probability of {label} ({result.resolved}). Label each row as "
                   "what it is: a row of another class is worth labeling too.")
    listed = hashlib.sha1("\n".join(map(str, rows["id"])).encode()).hexdigest()[:12]
    _label_form(store, rows, labels, multi_label, form_key="label_class_rows", editor_key=f"class_rows_{listed}",
                who_key=state.GROW_CLASS_WHO, submit="Add these rows to dev", note=f"found as likely {raw_label}")


def _label_form(store: Store, rows: pd.DataFrame, labels: tuple[str, ...], multi_label: bool, *, form_key: str,
                editor_key: str, who_key: str, submit: str, note: str) -> None:
    """`rows` in an editor with a label column (a label set per row on a multi-label task), the expert's name, and a
    button that labels the chosen rows into dev."""
    rows = rows.copy()
    fixed = list(rows.columns)
    if multi_label:
        column = "your labels"
        rows.insert(2, column, [[] for _ in range(len(rows))])
        config = st.column_config.MultiselectColumn(options=list(labels),
                                                    help="every label the row has; none leaves it unlabeled")
    else:
        column = "your label"
        rows.insert(2, column, NOT_LABELED)
        config = st.column_config.SelectboxColumn(options=[NOT_LABELED, *labels], required=True)
    with st.form(form_key, border=False):
        edited = st.data_editor(rows, hide_index=True, key=editor_key, disabled=fixed, column_config={column: config})
        # one name for both forms, kept while the expert visits other screens
        who = st.text_input("Your name (required: recorded with the labels)", key=who_key,
                            value=state.kept(state.EXPERT_NAME, ""),
                            placeholder="e.g. J. Curator")
        submitted = st.form_submit_button(submit, icon=":material/add_task:")
    if submitted:
        if who.strip():
            state.keep(state.EXPERT_NAME, who.strip())
        if multi_label:  # a cleared cell comes back as None
            chosen = {i: list(given) for i, given in zip(edited["id"], edited[column], strict=True)
                      if given is not None and len(given)}
        else:
            chosen = {i: label for i, label in zip(edited["id"], edited[column], strict=True) if label != NOT_LABELED}
        add_to_dev(store, chosen, who, note)


def add_to_dev(store: Store, chosen: dict[str, str | list[str]], who: str, note: str) -> None:
    if not chosen:
        st.warning("Pick a label for at least one row first.")
        return
    try:
        with editor.sandbox() as executor:
            moved = label_rows(store, executor, chosen, who, note)
    except (ValueError, RowsLeftInDev) as err:  # a refusal, or a failure that left the rows in dev: its own words
        st.error(str(err))
        return
    except Exception as err:  # noqa: BLE001 - label_rows undid the move: say so, keep the screen
        st.error(f"Nothing was labeled, the rows stay unlabeled: {type(err).__name__}: {err}")
        return
    state.flash(f"{len(moved)} row(s) joined dev, labeled by {who.strip()}. The next generation sees them; "
                "recompute the soft labels to include them.")
    st.rerun()


def expert_rows_table(store: Store, labels: tuple[str, ...]) -> None:
    """Every row the expert labeled into dev, with who and when; the last batch, or any rows chosen, can go back to
    the unlabeled pool (a wrong label there would otherwise stay gold for every later score and generation)."""
    record = store.expert_labels()
    if record.empty:
        return
    with st.expander(f"Rows labeled into dev in the studio ({len(record)})",
                     expanded=state.get(state.RETURN_OPEN, False)):
        names = [label_names(labels, v, s) for v, s in zip(record["label"], record["label_set"], strict=True)]
        st.dataframe(pd.DataFrame({"when": record["labeled_at"].astype(str).str[:19], "by": record["labeled_by"],
                                   "id": record["example_id"], "label": names,
                                   "text": record["text"], "note": record["note"]}), hide_index=True)
        last = record[record["labeled_at"] == record["labeled_at"].max()]
        left, right = st.columns(2)
        if left.button(f"Undo the last addition ({len(last)} row(s))", icon=":material/undo:", key="undo_last_rows",
                       help="they go back to the unlabeled pool, their labels dropped; dev scores are recomputed"):
            ask_return(list(last["example_id"]))
        chosen = right.multiselect("Return rows to the unlabeled pool", list(record["example_id"]),
                                   key=f"return_rows_{state.get(state.RETURN_VERSION, 0)}",
                                   placeholder="choose rows by id")
        if chosen and right.button(f"Return {len(chosen)} row(s)", key="return_rows_go", icon=":material/undo:"):
            ask_return(chosen)
    asked = state.get(state.RETURN_ASKED) or []
    if widgets.confirm(state.RETURN_CONFIRM, f"Return {len(asked)} row(s) to the unlabeled pool? Your labels on them, "
                       "with who gave them, when and why, are dropped; to have them back you label the rows again.",
                       "Return them"):
        return_to_pool(store, state.pop(state.RETURN_ASKED) or [])


def label_names(labels: tuple[str, ...], label: int, label_set: object) -> str:
    """A stored row's label name, or on a multi-label row its whole set, comma separated (label is its first)."""
    members = label_set if isinstance(label_set, (list, tuple, np.ndarray)) else [label]
    return ", ".join(labels[int(c)] for c in members)


def ask_return(ids: list[str]) -> None:
    """Ask before returning rows: it drops the expert's labels for good (nothing undoes the undo)."""
    state.put(state.RETURN_ASKED, ids)
    widgets.ask_confirm(state.RETURN_CONFIRM)


def return_to_pool(store: Store, ids: list[str]) -> None:
    moved = unlabel_rows(store, ids)
    state.put(state.RETURN_OPEN, True)
    state.put(state.RETURN_VERSION, state.get(state.RETURN_VERSION, 0) + 1)
    saved = store.path.parent / LABELS_DIR
    computed = saved.is_dir() and any(saved.iterdir())  # soft labels saved before: they still count these rows
    state.flash(f"{len(moved)} row(s) went back to the unlabeled pool, their labels dropped; dev scores are "
                "recomputed." + (" Recompute the soft labels to leave them out." if computed else ""))
    st.rerun()
