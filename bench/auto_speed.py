"""`auto` on ChemProt's 16K rows with the embeddings cached: how long `soft_labels(..., "auto")` takes.

The workspace is bench/quality.py's ChemProt one (dev 500 rows, default audit share, seed 0, 5 generations of the
offline agents on the compiled path). Sentence embeddings come from `--cache` (an .npz of text hashes and
vectors as bench/quality.py keeps them); texts it lacks are embedded and saved back first, timed apart as
`embed_missing_s`. The pool's votes on every split are stored before the clock starts, so `auto_s` is what
`evopool export --aggregator auto` spends after the votes: reading them, looking the embeddings up, TF-IDF,
fitting and choosing on dev, the student stage, predicting every row. `profile_top` lists the functions with
the most cumulative time in that call (cProfile, `--profile`). Test macro-F1 is scored afterwards.

    python bench/auto_speed.py [--cache bench/results/tmp/embeddings-chemprot.npz] [--profile]
                               [--out bench/results/auto_speed]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import load_embedding_cache, save_embedding_cache  # noqa: E402
from bench.throughput import measured, run_meta  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.apply.executor import CompiledExecutor  # noqa: E402
from engine.apply.votes import ensure_votes  # noqa: E402
from engine.embed.cache import embed_texts  # noqa: E402
from engine.embed.registry import get_embedder  # noqa: E402
from engine.evolve import EvolveConfig, evolve  # noqa: E402
from engine.ingest.importer import IngestOptions, import_path  # noqa: E402
from engine.labeling.features import masked_embeddings  # noqa: E402
from engine.labeling.fit import soft_labels  # noqa: E402
from engine.metrics.score import macro_f1  # noqa: E402
from engine.store.workspace import Store  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
TMP = ROOT / "bench" / "results" / "tmp"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=TMP / "embeddings-chemprot.npz")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the auto call (slower; lists hot spots)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "auto_speed")
    args = parser.parse_args()
    if not (SHARED / "chemprot").is_dir():
        sys.exit(f"no ChemProt at {SHARED / 'chemprot'}: this benchmark needs ../shared/data")
    meta = run_meta("auto_speed.py")
    workdir = TMP / "auto-speed-chemprot"
    shutil.rmtree(workdir, ignore_errors=True)
    store = Store.open(workdir)
    import_path(store, SHARED / "chemprot", IngestOptions(dev_size=500, seed=0))
    record: dict = {"rows": store.count_examples(), "dev": store.count_examples("dev")}
    texts = list(store.examples_frame()["text"])
    load_embedding_cache(store, args.cache)  # nothing when the file is missing
    started = time.perf_counter()
    embed_texts(store, texts, get_embedder())  # what the cache lacked (default embedder), before the clock
    masked_embeddings(store, store.examples_frame())  # and the masked views auto reads on this relation task
    record["embed_missing_s"] = round(time.perf_counter() - started, 1)
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    save_embedding_cache(store, args.cache)
    with CompiledExecutor() as executor:
        started = time.perf_counter()
        evolve(store, OfflineProposer(), executor, args.generations, EvolveConfig(seed=0))
        record["evolve_s"] = round(time.perf_counter() - started, 1)
        pool = store.pool_ids()
        record["annotators"] = len(pool)
        for split in ("dev", "test", "pool"):
            ensure_votes(store, executor, pool, split)
        profiler = cProfile.Profile() if args.profile else None
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        result = soft_labels(store, executor, "auto")
        if profiler:
            profiler.disable()
        record["auto_s"] = round(time.perf_counter() - started, 1)
    record["auto_chose"] = result.soft.aggregator
    position = {e: i for i, e in enumerate(result.soft.example_ids)}
    test_rows = np.array([position[e] for e in store.example_ids("test")])
    k = len(store.load_task().labels)
    record["test_macro_f1"] = round(macro_f1(store.label_indices("test"), result.hard[test_rows], k), 4)
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        record["profile_top"] = out.getvalue().splitlines()[-30:]
    Store.close_all()
    print(json.dumps({k: v for k, v in record.items() if k != "profile_top"}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "record": record}, indent=1))
    args.out.with_suffix(".md").write_text(
        "# `auto` on ChemProt with embeddings cached: `bench/auto_speed.py` (issue 15)\n\n"
        + measured(meta) + "\n\n| figure | value |\n|---|---|\n"
        + "".join(f"| {k} | {v} |\n" for k, v in record.items() if k != "profile_top"))


if __name__ == "__main__":
    main()
