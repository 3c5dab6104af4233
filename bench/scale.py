"""Scale benchmark: a 100K-row workspace from import to soft labels, and how fast each studio page renders.

The rows are the bundled demo (YouTube comments): its labeled dev/test rows as they are, and its 1,686 pool
comments resampled with replacement up to --rows (each copy gets a " #<n>" suffix, so every text is distinct
for the embedding cache). Timed steps: import, evolve (offline agents), the pool voting on every row (template
annotators compiled, any other code in the sandbox workers), soft labels with majority vote and with EvoAgg
over the static embedding table, and each page's first and second render under Streamlit's AppTest.

    python bench/scale.py [--rows 100000] [--generations 2] [--out bench/results/scale.md]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import date
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.apply.votes import ensure_votes  # noqa: E402
from engine.evolve import evolve  # noqa: E402
from engine.ingest.importer import IngestOptions, import_frame  # noqa: E402
from engine.jobs import JobRegistry, start_labels  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

AGGREGATORS = ("mv", "evoagg", "auto")
PAGES = ("pages/project.py", "pages/evolve.py", "pages/annotator.py", "pages/analytics.py", "pages/labels.py")


def build_frame(rows: int) -> pd.DataFrame:
    demo = pd.read_csv(ROOT / "data" / "demo" / "youtube_spam.csv", dtype=str, keep_default_na=False)
    labeled = demo[demo["split"] != "pool"]
    pool = demo[demo["split"] == "pool"].sample(rows - len(labeled), replace=True, random_state=0)
    pool = pool.assign(text=pool["text"] + " #" + pd.Series(range(len(pool)), index=pool.index).astype(str))
    frame = pd.concat([labeled, pool], ignore_index=True)
    frame["id"] = [f"r{i}" for i in range(len(frame))]
    return frame


def _labels(workdir: Path, aggregator: str):
    job = start_labels(workdir, aggregator, compare=False, registry=JobRegistry())
    job.wait()
    return job


def timed(results: dict, key: str, fn):
    started = time.monotonic()
    out = fn()
    results[key] = round(time.monotonic() - started, 2)
    print(f"{key}: {results[key]} s", file=sys.stderr, flush=True)
    return out


def time_pages(home: Path, name: str, annotator_id: str) -> dict[str, tuple[float, float]]:
    """(first, second) render seconds of each page; the second run is what a user sees on each click."""
    from streamlit.testing.v1 import AppTest

    os.environ["EVOPOOL_HOME"] = str(home)
    out = {}
    for page in PAGES:
        app = AppTest.from_file(str(ROOT / "streamlit_app.py"), default_timeout=300)
        app.query_params["ws"] = name
        app.query_params["annotator"] = annotator_id
        started = time.monotonic()
        app.run()  # the app opens on the project screen
        first = time.monotonic() - started
        if page != PAGES[0]:
            app.switch_page(page)
            started = time.monotonic()
            app.run()
            first = time.monotonic() - started
        started = time.monotonic()
        app.run()
        second = time.monotonic() - started
        if app.exception or app.error or app.info:  # an info box here means the page had nothing to show
            raise RuntimeError(f"{page} did not render its content: "
                               f"{[e.value for e in [*app.exception, *app.error, *app.info]]}")
        out[page] = (round(first, 2), round(second, 2))
        print(f"{page}: {out[page]}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--home", type=Path, default=ROOT / "bench" / "results" / "tmp" / "scale-home")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale.md")
    args = parser.parse_args()
    name = f"scale{args.rows}"
    if args.home.exists():
        shutil.rmtree(args.home)
    store = Store.open(args.home / name)
    store.set_meta("embedder", "static")  # MiniLM would take ~25 min for 100K rows on 2 cores
    r: dict = {"rows": args.rows}
    frame = build_frame(args.rows)
    timed(r, "import_s", lambda: import_frame(store, frame, IngestOptions(), dataset="scale", source="demo x"))
    with CompiledExecutor() as executor:
        timed(r, "evolve_s", lambda: evolve(store, OfflineProposer(), executor, args.generations))
        pool = store.pool_ids()
        r["pool"] = len(pool)
        timed(r, "vote_pool_s", lambda: ensure_votes(store, executor, pool, "pool"))
        r["votes_per_s"] = round(len(pool) * store.count_examples("pool") / r["vote_pool_s"])
    for agg in AGGREGATORS:  # the studio's background job: fit, label every row, save for the pages
        job = timed(r, f"labels_{agg}_s", lambda agg=agg: _labels(args.home / name, agg))
        if job.error:
            raise RuntimeError(f"labels with {agg} failed: {job.error}")
    Store.close_all()  # the pages open the workspace themselves
    pages = time_pages(args.home, name, pool[0])
    text = (f"Measured {date.today().isoformat()} on {machine()} with `python bench/scale.py --rows {args.rows}` "
            f"(the demo's pool resampled to {args.rows:,} rows; offline agents, {args.generations} generations; "
            "EvoAgg over the static embedding table).\n\n"
            "| step | seconds |\n|---|---|\n"
            f"| import {args.rows:,} rows | {r['import_s']} |\n"
            f"| evolve {args.generations} generations (dev only) | {r['evolve_s']} |\n"
            f"| {r['pool']} annotators vote on every pool row (compiled / sandbox) | {r['vote_pool_s']} "
            f"({r['votes_per_s']:,} annotator-votes/s) |\n"
            f"| soft labels, majority vote (votes cached), saved | {r['labels_mv_s']} |\n"
            f"| soft labels, EvoAgg (embeds every row once), saved | {r['labels_evoagg_s']} |\n"
            f"| soft labels, auto (embeddings cached; adds TF-IDF), saved | {r['labels_auto_s']} |\n\n"
            "| page | first render s | next render s |\n|---|---|---|\n"
            + "".join(f"| {page} | {first} | {second} |\n" for page, (first, second) in pages.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({**r, "pages": pages}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
