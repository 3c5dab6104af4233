"""Project & data: open or create a workspace, bring data in (or load the demo), see what is there."""
import streamlit as st

from engine.domain import AUDIT
from engine.ingest.errors import IngestError
from studio import describe_ui, importer, queries, state, widgets, workspaces_ui

widgets.header("Project & data", "bring your data")
store = widgets.current_store()
workspaces_ui.undo_last_delete()

# ---- start: the demo, or a new workspace ----------------------------------------------------------------
if store is None or not store.has_data():
    importer.start_cards()

if store is None:
    with st.expander("Manage workspaces: rename, delete, restore"):
        workspaces_ui.manage()
    st.stop()

# ---- import data into an empty workspace ---------------------------------------------------------------
if not store.has_data():
    st.header("Bring data")
    source = st.radio("Where is the data?", ["Upload a file", "A path on the server (file or WRENCH folder)"],
                      horizontal=True, key="import_source")
    frame, name, location, wrench_labels, problems = None, "", None, None, []
    content = ""  # which upload, or which state of the file on the server: a fixed file is another import
    try:
        if source == "Upload a file":
            limit_mb = st.get_option("server.maxUploadSize")
            upload = st.file_uploader("CSV, TSV, JSONL or Parquet", type=["csv", "tsv", "jsonl", "json", "parquet"],
                                      key="upload", help=f"Up to {limit_mb} MB a file (server.maxUploadSize in "
                                      ".streamlit/config.toml). Larger data: give its path on the server below, "
                                      "or import it with `evopool run`.")
            st.caption(f"Files up to {limit_mb} MB; for larger ones choose \"A path on the server\".")
            if upload is not None:
                (frame, problems), name = importer.read_upload(upload.getvalue(), upload.name), upload.name
                content = upload.file_id
        else:
            location = st.text_input("Path", placeholder="/data/wrench/youtube  or  /data/comments.csv",
                                     key="import_path").strip() or None
            if location:
                frame, wrench_labels, problems = importer.read_location(location)
                name = location.rstrip("/").split("/")[-1]
                content = importer.file_state(location)
    except IngestError as err:
        st.error(str(err))
    if frame is not None:
        st.subheader("Preview")
        st.caption(f"{len(frame):,} rows · columns: {queries.escape_md(', '.join(map(str, frame.columns)))}")
        st.dataframe(frame.head(20), hide_index=True, height=280)
        importer.read_problems_table(problems, "cannot be read")
        st.subheader("Columns and task")
        dataset = name.rsplit(".", 1)[0] if not wrench_labels else name
        opts = importer.column_mapping(frame, wrench_labels, dataset)
        listed = importer.plan_summary(frame, opts, wrench_labels, problems)
        asked = importer.asked(opts, location or name, content)
        if st.button("Import", type="primary", icon=":material/upload:", key="do_import"):
            importer.start(store, frame, opts, dataset=dataset, source=location or name,
                           wrench_folder=location if wrench_labels else None, wrench_labels=wrench_labels,
                           read_problems=problems, asked_as=asked)
        importer.progress(store)
        importer.show_problems(store, asked, listed)
    with st.expander("Manage workspaces: rename, delete, restore"):
        workspaces_ui.manage()
    st.stop()

# ---- a workspace with data ---------------------------------------------------------------------------
report = state.pop(state.LAST_IMPORT) or importer.unseen_report(store)
if report is not None:
    importer.show_report(report)
task = store.load_task()
counts = store.split_counts()
cols = st.columns(4)
cols[0].metric("Rows", f"{store.count_examples():,}")
cols[1].metric("Unlabeled (pool)", f"{counts.get('pool', 0):,}")
n_audit = store.count_examples(AUDIT)
cols[2].metric("Dev (labeled)", f"{counts.get('dev', 0):,}" + (f" ({n_audit:,} audit)" if n_audit else ""),
               help="the agents and the gate see the fitness rows; audit rows are held back from them, so the "
                    "auto aggregator is chosen on rows the pool was not selected on")
cols[3].metric("Test (holdout)", f"{counts.get('test', 0):,}")
MAX_SHOWN_LABELS = 40  # past this many, the labels line names the first ones and the rest open in a table
shown = widgets.name_a_few([queries.code_span(lab) for lab in task.labels], MAX_SHOWN_LABELS)
st.markdown(f"**Task:** {queries.escape_md(task.name)} · **{len(task.labels):,} labels:** {shown}")
widgets.table_of_all([[lab] for lab in task.labels], ["label"], MAX_SHOWN_LABELS, f"All {len(task.labels):,} labels")
if task.instructions:
    st.markdown(f"**Instructions:** {queries.escape_md(task.instructions)}")
describe_ui.descriptions_table(store, task)
describe_ui.describe_labels(store, task)

st.subheader("Rows")
split = st.segmented_control("Split", ["pool", "dev", "test"], default="dev", key="rows_split") or "dev"
page_rows = queries.examples_page(store, split, key="rows_page")
st.dataframe(page_rows, hide_index=True)
st.page_link("pages/evolve.py", label="Next: evolve the annotator pool", icon=":material/arrow_forward:")
with st.expander("Start another project, or load the demo again"):
    importer.start_cards()
with st.expander("Manage workspaces: rename, delete, restore"):
    workspaces_ui.manage()
