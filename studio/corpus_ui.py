"""The labels screen's corpus panel: label a file or glob that never enters the workspace (local engine, a
background job with progress), and the command that runs the same labeling on a Ray cluster."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from engine.jobs import REGISTRY, cluster_command, start_corpus_label
from engine.markdown import escape_md
from studio import widgets
from studio.refresh import AppRefresh, poll_job


def corpus_panel(workdir: Path, aggregator: str) -> None:
    """Inputs, a start button, live progress and the finished run's summary; one corpus job at a time."""
    with st.expander("Label a corpus outside the workspace (Parquet / CSV / JSONL, millions of rows)"):
        st.caption("The pool and the aggregator fitted on this workspace's dev rows label every row of the files "
                   "and write Parquet shards plus `_manifest.json`; nothing is imported. Ids come from the id "
                   "column (any case), else `<file>:<row>`.")
        left, mid, right = st.columns([3, 3, 1])
        corpus = left.text_input("Corpus: a file, a folder or a glob", key="corpus_input",
                                 placeholder="/data/comments/*.parquet")
        widgets.default_from("corpus_output", str(workdir), str(workdir / "corpus_labels"))  # this workspace's
        output = mid.text_input("Output folder (empty, or this run's to resume it)", key="corpus_output")
        batch = int(right.number_input("Rows per shard", 100, 1_000_000, 10_000, step=1000, key="corpus_batch"))
        text_col, id_col = st.columns(2)
        text_column = text_col.text_input("Text column", "text", key="corpus_text_column").strip() or "text"
        id_column = id_col.text_input("Id column", "id", key="corpus_id_column",
                                      help="kept as each row's id in the output (e.g. doc_id)").strip() or "id"
        running = REGISTRY.running(workdir, "corpus")
        if st.button("Label the corpus here", disabled=running is not None or not corpus.strip(),
                     icon=":material/dataset:", key="corpus_start",
                     help=f"local engine, in the background, with {aggregator}"):
            try:
                start_corpus_label(workdir, corpus.strip(), output.strip(), aggregator, batch_size=batch,
                                   text_column=text_column, id_column=id_column)
                st.rerun()
            except Exception as err:  # already running: a message, not a traceback
                st.error(f"Could not start: {err}")
        _progress(workdir, running is not None)
        st.markdown("**On a Ray cluster** (every node needs `pip install 'evopool-studio[ray]'` and the output "
                    "folder on shared storage):")
        st.code(cluster_command(workdir, corpus.strip() or "CORPUS_GLOB", output.strip(), aggregator, batch,
                                text_column, id_column), language="bash")


def _progress(workdir: Path, was_running: bool) -> None:
    def live(refresh_app: AppRefresh) -> None:
        job = REGISTRY.running(workdir, "corpus") or REGISTRY.latest(workdir, "corpus")
        if job is None:
            return
        if job.running:
            st.progress(min(1.0, job.progress), text=f"{job.message or 'working'}…")
            return
        if was_running:
            refresh_app()  # from a timed run; the first draw goes on to show how the job ended
        if job.status == "failed":
            st.error(f"Labeling the corpus failed: {escape_md(job.error)}")
        elif job.result:
            result = job.result
            st.success(f"Labeled {result['rows']:,} rows into {result['shards']} shards "
                       f"({result['rows_per_s'] or 0:,.0f} rows/s): `{result['manifest']}`")

    poll_job(live, 1.0 if was_running else None)
