"""Corpus labeling throughput: `evopool label`'s engines on one machine, rows/s and Ray's cost per batch.

The workspace is the bundled demo after --generations offline generations; the corpus is its comments
resampled to --rows rows (4 Parquet files, no id column). Timed: the local engine (in-process, a sandbox of 2
worker processes), Ray with 1 writer actor and with 2 (one local Ray instance with 2 CPUs, started once and
timed apart), each from the first batch to the manifest (fitting the aggregator once, before, is not timed).
Ray's overhead per batch is measured apart on small batches: (Ray 1 actor - local with a 1-process sandbox) / batches.

    python bench/corpus_scale.py [--rows 1000000] [--batch-size 10000] [--aggregator wmv]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import commit, machine  # noqa: E402
from engine.cli import main as evopool  # noqa: E402
from engine.corpus.engines import label_corpus  # noqa: E402
from engine.corpus.labeler import fit_labeler  # noqa: E402
from engine.corpus.reading import find_files, survey  # noqa: E402
from engine.sandbox.executor import SandboxExecutor  # noqa: E402
from engine.store.workspace import Store  # noqa: E402


def build_corpus(folder: Path, rows: int, files: int = 4) -> list[Path]:
    text = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str, keep_default_na=False)["text"]
    pick = np.random.default_rng(0).integers(0, len(text), size=rows)
    frame = pd.DataFrame({"text": text.to_numpy()[pick]})
    out = []
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        path = folder / f"part{i}.parquet"
        frame.iloc[part].to_parquet(path, index=False)
        out.append(path)
    return out


def timed(labeler, files, output: Path, **kwargs) -> dict:
    began = time.perf_counter()
    result = label_corpus(labeler, files, output, **kwargs)
    seconds = time.perf_counter() - began
    shutil.rmtree(output)
    return {"seconds": round(seconds, 2), "rows": result["rows"], "rows_per_s": round(result["rows"] / seconds, 1),
            "batches": result["shards"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--overhead-rows", type=int, default=20_000, help="rows for the per-batch overhead runs")
    parser.add_argument("--overhead-batch", type=int, default=200)
    parser.add_argument("--aggregator", default="wmv")
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/corpus_scale.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="corpus_bench"))
    ws = work / "ws"
    assert evopool(["run", str(ROOT / "data/demo/youtube_spam.csv"), "--workdir", str(ws),
                    "--generations", str(args.generations)]) == 0
    with SandboxExecutor() as executor:
        labeler = fit_labeler(Store.open(ws), executor, args.aggregator)
    Store.close_all()
    (work / "corpus").mkdir()
    files = survey(find_files(build_corpus(work / "corpus", args.rows)[0].parent))
    local = timed(labeler, files, work / "o1", batch_size=args.batch_size, workers=2)
    import ray

    began = time.perf_counter()  # started once here, so the runs below time the labeling, not Ray's start
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    ray_start_s = round(time.perf_counter() - began, 2)
    runs = {
        "local (sandbox of 2 processes)": local,
        "ray, 1 writer actor": timed(labeler, files, work / "o2", engine="ray", workers=1,
                                     batch_size=args.batch_size),
        "ray, 2 writer actors": timed(labeler, files, work / "o3", engine="ray", workers=2,
                                      batch_size=args.batch_size),
    }
    (work / "small").mkdir()
    small = survey(find_files(build_corpus(work / "small", args.overhead_rows, files=1)[0]))
    local_small = timed(labeler, small, work / "s1", batch_size=args.overhead_batch, workers=1)
    ray_small = timed(labeler, small, work / "s2", engine="ray", workers=1, batch_size=args.overhead_batch)
    ray.shutdown()
    overhead_ms = 1000 * (ray_small["seconds"] - local_small["seconds"]) / local_small["batches"]
    record = {"date": date.today().isoformat(), "machine": machine(), "commit": commit(), "rows": args.rows,
              "batch_size": args.batch_size, "aggregator": labeler.made_by, "annotators": len(labeler.annotators),
              "runs": runs, "ray_start_s": ray_start_s,
              "overhead": {"local": local_small, "ray": ray_small, "ms_per_batch": round(overhead_ms, 1),
                           "rows_per_batch": args.overhead_batch}}
    lines = [f"# Corpus labeling throughput (`bench/corpus_scale.py`, commit {record['commit']})", "",
             f"Measured {record['date']} on {record['machine']} (CPU shared with other jobs) with "
             f"`python bench/corpus_scale.py --rows {args.rows} --batch-size {args.batch_size} --aggregator "
             f"{args.aggregator}`: {len(labeler.annotators)} annotators, aggregator `{labeler.made_by}`.", "",
             "| engine | rows | batches | seconds | rows/s |", "|---|---|---|---|---|"]
    for name, run in runs.items():
        lines.append(f"| {name} | {run['rows']:,} | {run['batches']} | {run['seconds']} | {run['rows_per_s']:,.0f} |")
    lines += ["", f"Ray's overhead per batch: {overhead_ms:.1f} ms ({args.overhead_rows:,} rows in batches of "
              f"{args.overhead_batch}: local with a 1-process sandbox {local_small['seconds']} s, Ray with 1 actor "
              f"{ray_small['seconds']} s, {local_small['batches']} batches; includes starting the actor and loading "
              f"the labeler, not starting Ray, which took {ray_start_s} s once).", ""]
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
