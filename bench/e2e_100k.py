"""End to end at 100K rows: import -> pool votes -> `auto` -> CSV export, with sentence embeddings cold and cached.

The rows are ChemProt (../shared/data): its valid (dev) and test rows as they are, and its train rows resampled
with replacement up to --rows. By default the copies keep their text, so the embedding cache (keyed on the text)
embeds ChemProt's ~16K distinct texts once; `--distinct` gives each copy a " #<n>" suffix so all 100K texts
must be embedded (MiniLM on 2 loaded cores: ~30-160 texts/s, so 10-55 minutes). Runs, each in a fresh workspace:

  cold     nothing cached: every distinct text is embedded with the default embedder (MiniLM)
  cached   the cold run's embeddings are put into the workspace first (as bench/quality.py does across seeds)
  static   nothing cached, the fast embedder (`static`: a token table distilled from MiniLM); its test macro-F1
           beside cold's is what the fast path costs

Timed stages: import; evolve (the offline agents, dev rows only: reported, not part of the labeling path); the
pool's votes on every row (`CompiledExecutor`, as `evopool` runs them); labeling (`soft_labels(..., "auto")`, as
`evopool export` runs it), reported whole and in two parts: `features_s`, the vote matrix and every text feature
(sentence embeddings and, ChemProt being a relation task, the two masked views: cold, computed; cached, looked
up; TF-IDF), and `auto_s`, fitting on dev, choosing on the audit rows and predicting every row; CSV export
(`write_export`). `label_path_s` = import + votes + labeling + export: each embedding is computed or looked up
once, as in a user's export. Test macro-F1 is scored on the export's test rows afterwards (test labels read
only to score).

    python bench/e2e_100k.py [--rows 100000] [--runs cold cached static] [--distinct] [--generations 5]
                             [--out bench/results/e2e_100k]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import load_embedding_cache, save_embedding_cache  # noqa: E402
from bench.throughput import measured, run_meta, save_result  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.apply.votes import ensure_votes  # noqa: E402
from engine.embed.registry import workspace_embedder  # noqa: E402
from engine.events import EventKind  # noqa: E402
from engine.evolve import EvolveConfig, evolve  # noqa: E402
from engine.export.files import write_export  # noqa: E402
from engine.ingest.importer import IngestOptions, import_frame  # noqa: E402
from engine.ingest.readers import read_wrench  # noqa: E402
from engine.labeling.fit import soft_labels  # noqa: E402
from engine.metrics.score import macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
TMP = ROOT / "bench" / "results" / "tmp"


def build_frame(rows: int, distinct: bool) -> tuple[pd.DataFrame, tuple[str, ...]]:
    frame, labels = read_wrench(SHARED / "chemprot")
    labeled = frame[frame["split"] != "pool"]
    pool = frame[frame["split"] == "pool"].sample(rows - len(labeled), replace=True, random_state=0)
    suffix = pd.Series(range(len(pool)), index=pool.index).astype(str)
    pool = pool.assign(text=pool["text"] + " #" + suffix if distinct else pool["text"], id="pool-" + suffix)
    return pd.concat([labeled, pool], ignore_index=True), labels


def timed(record: dict, key: str, fn):
    started = time.perf_counter()
    out = fn()
    record[key] = round(time.perf_counter() - started, 2)
    print(f"  {key}: {record[key]} s", file=sys.stderr, flush=True)
    return out


def run(kind: str, frame: pd.DataFrame, labels: tuple[str, ...], generations: int, cache: Path) -> dict:
    workdir = TMP / f"e2e-{kind}"
    if workdir.exists():
        shutil.rmtree(workdir)
    store = Store.open(workdir)
    if kind == "static":
        store.set_meta("embedder", "static")
    record: dict = {"run": kind, "rows": len(frame), "distinct_texts": int(frame["text"].nunique())}
    opts = IngestOptions(id_column="id", label_column="label", split_column="split", text_column="text",
                         dev_size=500, seed=0)
    timed(record, "import_s", lambda: import_frame(store, frame, opts, dataset="chemprot-100k",
                                                   source="chemprot x", labels=labels))
    if kind == "cached":
        timed(record, "load_embedding_cache_s", lambda: load_embedding_cache(store, cache))
    with CompiledExecutor() as executor:  # what evopool runs: templates compiled, other code sandboxed
        timed(record, "evolve_s", lambda: evolve(store, OfflineProposer(), executor, generations,
                                                  EvolveConfig(seed=0)))
        pool = store.pool_ids()
        record["annotators"] = len(pool)

        def votes() -> None:
            for split in ("dev", "test", "pool"):
                ensure_votes(store, executor, pool, split)
        timed(record, "votes_s", votes)
        record["votes_per_s"] = round(len(pool) * len(frame) / record["votes_s"])
        record["embedder"] = workspace_embedder(store).name
        started, marks = time.perf_counter(), {}

        def on_event(kind: EventKind, payload: dict) -> None:  # features are ready when aggregating starts
            if kind == EventKind.AGGREGATING:
                marks["features"] = time.perf_counter()
        result = timed(record, "label_s", lambda: soft_labels(store, executor, "auto", on_event=on_event))
        record["features_s"] = round(marks["features"] - started, 2)
        record["auto_s"] = round(record["label_s"] - record["features_s"], 2)
    record["auto_chose"] = result.soft.aggregator
    out = workdir / "labels.csv"
    timed(record, "export_s", lambda: write_export(store, result.soft, result.hard, result.n_votes, out, "csv"))
    record["exported_rows"] = sum(1 for _ in out.open()) - 1
    record["label_path_s"] = round(sum(record[k] for k in ("import_s", "votes_s", "label_s", "export_s")), 2)
    position = {e: i for i, e in enumerate(result.soft.example_ids)}
    test_rows = np.array([position[e] for e in store.example_ids("test")])
    record["test_macro_f1"] = round(macro_f1(store.label_indices("test"), result.hard[test_rows], len(labels)), 4)
    if kind == "cold":
        save_embedding_cache(store, cache)
    Store.close_all()
    return record


def markdown(records: list[dict], meta: dict) -> str:
    keys = ["embedder", "distinct_texts", "import_s", "evolve_s", "votes_s", "label_s", "features_s", "auto_s",
            "export_s", "label_path_s", "test_macro_f1", "auto_chose", "annotators", "votes_per_s", "exported_rows"]
    lines = ["# End to end at 100K rows: `bench/e2e_100k.py` (issue 15)\n",
             measured(meta) + f" ChemProt: valid (dev 500, the rest pool) and test as they "
             f"are, train resampled to {records[0]['rows']:,} rows. `label_path_s` = import + "
             "votes + label + export (evolve, on dev only, is apart); `label_s` = "
             "`soft_labels(store, executor, \"auto\")` as `evopool export` runs it, split into `features_s` (the "
             "vote matrix and every text feature: embeddings computed or looked up, TF-IDF) and `auto_s` (choosing "
             "on dev and predicting every row).\n",
             "| stage | " + " | ".join(r["run"] for r in records) + " |", "|---|" + "---|" * len(records)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(str(r.get(key, "–")) for r in records) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", nargs="+", default=["cold", "cached", "static"],
                        choices=["cold", "cached", "static"])
    parser.add_argument("--distinct", action="store_true", help="make every copied text distinct")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "e2e_100k")
    args = parser.parse_args()
    if not (SHARED / "chemprot").is_dir():
        sys.exit(f"no ChemProt at {SHARED / 'chemprot'}: this benchmark needs ../shared/data")
    frame, labels = build_frame(args.rows, args.distinct)
    cache = TMP / f"e2e-embeddings-{args.rows}{'-distinct' if args.distinct else ''}.npz"
    meta = run_meta("e2e_100k.py")
    records = []
    for kind in args.runs:
        print(f"== {kind}", file=sys.stderr, flush=True)
        records.append(run(kind, frame, labels, args.generations, cache))
        print(json.dumps(records[-1]), flush=True)
        save_result(args.out, {"meta": meta, "records": records}, markdown(records, meta))


if __name__ == "__main__":
    main()
