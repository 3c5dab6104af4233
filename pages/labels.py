"""Labels & export: turn the pool's votes into soft labels, check them, and download the labeled data."""
import streamlit as st

from engine.aggregators.registry import DEFAULT_AGGREGATOR, DESCRIPTIONS, aggregator_entry
from engine.export import files as export
from engine.export import hf as export_hf
from engine.jobs import REGISTRY, start_labels
from engine.labeling.features import aggregators_for
from engine.labeling.fit import THRESHOLD
from engine.markdown import escape_md
from engine.store.saved_labels import stale_reason
from studio import corpus_ui, figures, labels_ui, regression_ui, state, widgets
from studio.refresh import AppRefresh, poll_job

widgets.header("Labels & export", "soft labels for every row, and the files to take away")
store = widgets.require_data()
widgets.require_pool(store)
name = state.workspace_name()
task = store.load_task()
workdir = store.path.parent
job = REGISTRY.running(workdir, "labels")

# ---- choose and compute ---------------------------------------------------------------------------
with st.container(border=True):
    left, right = st.columns([2, 1])
    usable = aggregators_for(task)  # a multi-label task has no vote-only aggregators
    shown = state.kept(state.AGGREGATOR, DEFAULT_AGGREGATOR)  # the one chosen before a visit to another screen
    aggregator = left.selectbox("Aggregator", usable, key=state.AGGREGATOR,
                                index=usable.index(shown if shown in usable else DEFAULT_AGGREGATOR),
                                format_func=lambda a: f"{a}: {DESCRIPTIONS[a]}")
    state.keep(state.AGGREGATOR, aggregator)
    result = labels_ui.saved(name, aggregator)
    stale = None if result is None else stale_reason(store, result.pool_ids, result.pool_key)
    label = "Recompute soft labels" if result is not None else "Compute soft labels"
    if right.button(label, type="primary", disabled=job is not None, icon=":material/calculate:", key="labels_start",
                    help="runs the pool on every row, embeds the texts and fits the aggregator (a background job)"):
        try:
            start_labels(workdir, aggregator)
            st.rerun()
        except Exception as err:  # already running, empty pool: a message, not a traceback
            st.error(f"Could not start: {err}")


drawn_from = labels_ui.saved_stamp(name, aggregator)  # the saved labels this run draws


def labels_progress(refresh_app: AppRefresh) -> None:
    current = REGISTRY.running(workdir, "labels")
    if job is not None and (current is None or labels_ui.saved_stamp(name, aggregator) != drawn_from):
        refresh_app()  # the job ended, or saved the labels before its comparison: draw them
    latest = current or REGISTRY.latest(workdir, "labels")
    if latest is not None and latest.running:
        # named: the steps of auto's comparison ("aggregating mv") read as if another aggregator were being computed
        st.progress(min(1.0, latest.progress), text=f"Soft labels with {latest.params.get('aggregator', '')}: "
                                                    f"{latest.message or 'working'}…")
    elif latest is not None and latest.status == "failed":
        st.error(f"Computing soft labels failed: {escape_md(latest.error)}")


poll_job(labels_progress, 1.0 if job is not None else None)
corpus_ui.corpus_panel(workdir, aggregator)
if result is None:
    st.info("No soft labels for this aggregator yet: they are being computed (above)." if job is not None else
            "No soft labels for this aggregator yet: press **Compute soft labels** (it runs in the background; "
            "you can keep working on other screens).")
    regression_ui.label_rows_for_dev(store, task.labels, task.multi_label, None)  # a thin class grows without them
    regression_ui.expert_rows_table(store, task.labels)  # rows labeled into dev can go back without soft labels
    st.stop()
if stale == "The pool changed" and result.dev_scores.uses_pool is False:
    # labels of the text alone do not change with the pool; a chooser's choice might, a fixed model's not at all
    if aggregator_entry(aggregator).chooses and aggregator_entry(aggregator).reads_votes:  # auto, auto-pool
        st.info(f"The pool changed since these soft labels were computed. They do not read it ({result.resolved} "
                "learned from the text alone), but a recompute weighs the new pool and may choose a model that does.")
elif stale:
    st.warning(f"{stale} since these soft labels were computed: recompute to include the changes.")
if task.multi_label:  # a class is predicted where its probability reaches the threshold: no refit to move it
    threshold = st.slider("Threshold", 0.05, 0.95, float(result.dev_scores.threshold or THRESHOLD), 0.05,
                          key="labels_threshold", help="a row gets every class whose probability reaches it; the dev "
                          "figures below follow it (out-of-fold), and so do the browser and the downloads")
    result = labels_ui.at_threshold(store, result, threshold)

# ---- scores and plots ------------------------------------------------------------------------------
labels_ui.summary_metrics(result, task.labels)
if result.comparison.empty and job is not None:
    st.caption("The aggregators are being compared (above): their table joins these labels when it is done.")
if not result.comparison.empty:
    st.subheader("Aggregators compared: expected macro-F1, each from rows that neither fitted nor chose it")
    verdict = labels_ui.pool_verdict(result.comparison)
    if verdict is not None:
        (st.success if verdict[0] else st.info)(verdict[1])
    wide = st.column_config.TextColumn(width="large")  # model names: cut short at the default width
    st.dataframe(labels_ui.comparison_table(result.comparison), hide_index=True,
                 column_config={"auto chose": wide, "estimated on": wide})
dev_probs, dev_gold = labels_ui.dev_parts(store, result)
plots = labels_ui.plot_inputs(result, dev_probs, dev_gold, len(task.labels))
a, b, c = st.columns(3)
a.plotly_chart(figures.confidence_histogram(plots["confidence"]), key="confidence")
b.plotly_chart(figures.class_balance(task.labels, plots["predicted"], plots["dev"]), key="balance")
bins = figures.reliability_bins(plots["rel_confidence"], plots["rel_correct"])
c.plotly_chart(figures.reliability(bins), key="reliability")
st.caption("Dev rows carry out-of-fold probabilities (each from a model that never saw that row's label), so "
           "the reliability diagram and the dev scores are honest.")

# ---- browse -----------------------------------------------------------------------------------------
st.subheader("Labeled rows")
frame = labels_ui.labeled_frame(name, result)
labels_ui.browse(name, store, frame, task.labels)

# ---- regression list ---------------------------------------------------------------------------------
regression_ui.label_like(store, regression_ui.regression_list(store, result), task.labels, task.multi_label)
regression_ui.label_rows_for_dev(store, task.labels, task.multi_label, result)
regression_ui.expert_rows_table(store, task.labels)

# ---- downloads --------------------------------------------------------------------------------------
st.subheader("Download")
spreadsheet = st.toggle("CSV safe to open in a spreadsheet", key="csv_spreadsheet_safe",
                        help="An apostrophe before every text cell that starts with = + - @ (or a tab), so Excel or "
                             "LibreOffice shows it as text instead of running it as a formula (a comment such as "
                             "=HYPERLINK(...) would). Those cells then differ from your data by the apostrophe: "
                             "leave this off for a CSV you train on.")
if spreadsheet:
    quoted = export.spreadsheet_safe(frame)[1]
    st.caption(f"{quoted:,} cell{'' if quoted == 1 else 's'} will start with an apostrophe in the CSV." if quoted
               else "No cell looks like a formula: the CSV is the same either way.")
cols = st.columns(4) + st.columns(4)  # the data in four formats, then the pool and the manifest
for col, fmt in zip(cols[:3], ("csv", "jsonl", "parquet"), strict=True):
    col.download_button(f"Labeled data (.{fmt})", lambda fmt=fmt: export.frame_bytes(frame, fmt,
                                                                                   spreadsheet and fmt == "csv"),
                        file_name=f"{name}-labels.{fmt}", mime=labels_ui.MIME[fmt], on_click="ignore",
                        icon=":material/download:", key=f"download_{fmt}", type="primary" if fmt == "csv" else
                        "secondary")
hf_ready = export_hf.hf_available()
cols[3].download_button("Hugging Face dataset (.zip)",
                        lambda: export_hf.hf_zip_bytes(frame, task.labels, f"{name}-labels",
                                                       export.label_separator(store)),
                        file_name=f"{name}-labels-hf.zip", mime="application/zip", on_click="ignore",
                        icon=":material/dataset:", key="download_hf", disabled=not hf_ready,
                        help=("a DatasetDict (one split per workspace split) saved with save_to_disk; `label` is a "
                              "ClassLabel. Unzip, then datasets.load_from_disk(folder)") if hf_ready else
                        export_hf.HF_MISSING)
cols[4].download_button("The pool as Python (.py)", lambda: export.pool_as_python(store), file_name=f"{name}_pool.py",
                        mime="text/x-python", on_click="ignore", icon=":material/code:", key="download_py",
                        help="today's pool as runnable code; it labels by majority vote, not with these soft labels, "
                             "and after a verdict it is not the pool that made them")
cols[5].download_button("Manifest (.json)", lambda: labels_ui.manifest_json(store, result, frame, spreadsheet),
                        file_name=f"{name}-labels.manifest.json", mime="application/json", on_click="ignore",
                        icon=":material/receipt_long:", key="download_manifest",
                        help="provenance: the pool, the aggregator (and what auto chose), dev and audit scores")
if not hf_ready:
    st.caption(f"Hugging Face dataset: off, {export_hf.HF_MISSING}.")
if task.multi_label:
    cut = result.dev_scores.threshold or THRESHOLD
    st.caption(f"Columns: {', '.join(frame.columns)}. `labels` holds every class whose probability reaches "
               f"{cut}, joined by `{export.label_separator(store)}`; `n_votes` counts the annotators that "
               "voted on the row.")
else:
    st.caption(f"Columns: {', '.join(frame.columns)}. `label` is empty where no annotator voted and the aggregator "
               "gives no label; `n_votes` counts the annotators that voted on the row.")
