"""Analytics: how the pool covers the classes, where annotators overlap and conflict, who contributes."""
import numpy as np
import pandas as pd
import streamlit as st

from engine.domain import ABSTAIN, AUDIT, FITNESS
from engine.export import files as export
from engine.metrics import score
from studio import figures, queries, review_ui, state, widgets

widgets.header("Analytics", "the pool as a whole")
store = widgets.require_data()
widgets.require_pool(store)
task = store.load_task()
k = len(task.labels)
table = queries.annotator_table(store)
names = dict(zip(table["id"], table["name"], strict=True))

splits = queries.splits_with_votes(store) or ["dev"]
split = st.segmented_control("Rows", splits, default=splits[0], key="analytics_split",
                             help="dev: every labeled dev row (the fitness rows the gate judges on and any "
                                  "audit rows); pool: every unlabeled row (after soft labels were computed once)"
                             ) or splits[0]
votes, _, pool = queries.pool_votes(store, split)
short = [queries.short(a, names) for a in pool]
fitness_votes, fitness_gold, _ = queries.pool_votes(store, FITNESS)  # what the gate judged

cols = st.columns(4)
cols[0].metric("Annotators in the pool", len(pool))
cols[1].metric(f"Rows ({split})", f"{votes.shape[0]:,}")
cols[2].metric("Rows with ≥ 1 vote", f"{(votes != ABSTAIN).any(axis=1).mean():.1%}")
rule = "any vote" if task.multi_label else "majority vote"
if store.count_examples(AUDIT):  # the honest figure beside the one the pool was selected on
    audit_votes, audit_gold, _ = queries.pool_votes(store, AUDIT)
    unjudged = []
    if task.multi_label:
        audit_f1 = score.pool_macro_f1(audit_votes, audit_gold, k)
        fitness_f1 = score.pool_macro_f1(fitness_votes, fitness_gold, k)
    else:  # both on the classes the audit rows hold (macro-F1 averages over the classes present)
        audit_f1, fitness_f1, judged = score.audit_and_fitness_f1(audit_votes, audit_gold, fitness_votes,
                                                                  fitness_gold, k)
        unjudged = [task.labels[c] for c in np.flatnonzero(~judged)]
    same = (f" Both over the {k - len(unjudged)} classes the audit rows hold: none of {', '.join(unjudged)}, so "
            "the audit rows cannot judge those." if unjudged else "")
    # over fewer classes, the fitness figure here is not the dev macro-F1 the other screens show: the delta says so
    versus = f"vs fitness on {k - len(unjudged)} of {k} classes" if unjudged else "vs fitness"
    cols[3].metric("Pool audit macro-F1", f"{audit_f1:.3f}", f"{audit_f1 - fitness_f1:+.3f} {versus}",
                   help=f"the pool's {rule} on the audit rows; {fitness_f1:.3f} on the fitness rows the agents and "
                        "the gate chose it on. The audit rows were held back from them, so the gap shows how much "
                        f"of the fitness figure is selection.{same}")
    honest = queries.pool_audit_sentence(store)
    if honest:  # the same figure with its interval, as the Evolve screen says it
        st.caption(f"The pool as it stands, {fitness_f1:.3f} on the fitness rows.{honest}")
else:
    fitness_f1 = score.pool_macro_f1(fitness_votes, fitness_gold, k)
    cols[3].metric("Pool dev macro-F1", f"{fitness_f1:.3f}",
                   help=f"the pool's {rule} on the dev rows it was chosen on (no audit rows held back), so "
                        "optimistic")

review_ui.thin_class_note(store)
left, right = st.columns(2)
with left:
    dev_share = score.class_shares(store.gold("dev"), k)  # label sets on a multi-label task, as the Labels screen
    st.plotly_chart(figures.coverage_per_class(task.labels, score.coverage_per_class(votes, k), dev_share),
                    key="coverage")
with right:
    st.plotly_chart(figures.timeline(store.generations(), *queries.audit_by_generation(store)),
                    key="analytics_timeline")

overlap_tab, conflict_tab = st.tabs(["Overlap", "Conflict"])
with overlap_tab:
    st.plotly_chart(figures.heatmap(score.overlap_matrix(votes), short, "Share of rows both annotators fire on"),
                    key="overlap")
with conflict_tab:
    st.plotly_chart(figures.heatmap(score.conflict_matrix(votes), short,
                                    "Share of rows both fire on with different labels", "Reds"), key="conflict")

scatter_col, contrib_col = st.columns(2)
with scatter_col:
    scored = table.dropna(subset=["precision"]).tail(2000)
    event = st.plotly_chart(figures.precision_coverage(scored), key="precision_coverage", on_select="rerun",
                            selection_mode="points")
    points = event.selection.points if event and event.selection else []
    if points and points[0].get("customdata"):
        picked = points[0]["customdata"][0]
        state.select_annotator(picked)
        st.switch_page("pages/annotator.py", query_params={state.QP_WORKSPACE: state.workspace_name(),
                                                            state.QP_ANNOTATOR: picked})
with contrib_col:
    st.plotly_chart(figures.contributions(short, score.marginal_contributions(fitness_votes, fitness_gold, k)),
                    key="contributions")
    st.caption("How much the pool's majority vote loses in macro-F1 on the rows the gate judges on when the "
               "annotator is left out; red: the pool does better without it.")

st.subheader("Where the annotators disagree most")
entropy = score.disagreement(votes)
top = np.argsort(-entropy, kind="stable")[:20]
top = top[entropy[top] > 0]
if top.size == 0:
    st.caption("No row receives votes for two different classes.")
else:
    ids = store.example_ids(split)
    rows = store.examples_frame(split, ids=[ids[i] for i in top]).set_index("id")
    counts = score.vote_counts(votes[top], k)
    shown = pd.DataFrame({"id": [ids[i] for i in top], "text": [rows.loc[ids[i], "text"] for i in top],
                          "disagreement (bits)": entropy[top].round(3)})
    for c, label in enumerate(task.labels):
        shown[f"votes {label}"] = counts[:, c]
    if split == "dev":  # each row's whole label set on a multi-label task (as the export writes it)
        shown["gold"] = export.dev_gold(store, rows.loc[shown["id"]].reset_index(), task.labels, task.multi_label)
    st.dataframe(shown, hide_index=True)

st.subheader("Where the pool is weak")
weak_split = "pool" if "pool" in splits else split
spots, row_ids, row_texts = queries.weak_spot_groups(store, weak_split)
if weak_split != "pool":
    st.caption("The unlabeled rows get votes once soft labels are computed (Labels screen); until then this "
               f"groups the {weak_split} rows.")
if not spots:
    st.caption("Too few rows to group.")
else:
    st.plotly_chart(figures.weak_spots(spots, task.labels), key="weak_spots")
    focus = store.get_meta("focus")
    if focus:
        st.info(f"The next generation is aimed at: **{queries.escape_md(', '.join(focus['terms']))}** "
                f"({len(focus['example_ids'])} example rows).")
        if st.button("Stop aiming", key="focus_clear", icon=":material/close:"):
            store.set_meta("focus", None)
            st.rerun()
    for rank, spot in enumerate(spots[:5], start=1):
        top = task.labels[spot.top_label] if spot.top_label >= 0 else "no class"
        rows = f"{spot.size:,} row{'' if spot.size == 1 else 's'}"
        with st.expander(f"{rank}. {queries.escape_md(', '.join(spot.terms))} · {rows} · "
                         f"{spot.no_vote_share:.0%} no vote · {spot.conflict_share:.0%} conflicting · most voted: "
                         f"{queries.escape_md(top)}"):
            st.dataframe(pd.DataFrame({"id": [row_ids[i] for i in spot.example_rows],
                                       "text": [row_texts[i] for i in spot.example_rows]}), hide_index=True)
            if st.button("Aim the next generation here", key=f"focus_{spot.cluster}", icon=":material/my_location:",
                         help="the agents are shown these rows and words as where the pool needs annotators"):
                store.set_meta("focus", {"terms": list(spot.terms), "split": weak_split,
                                         "example_ids": [row_ids[i] for i in spot.example_rows]})
                st.rerun()
