"""First soft labels: how long after the last generation the studio's soft labels are shown, and how long a second
workspace on the same texts spends embedding.

The studio's jobs, in the studio's order, on a legal-sized table (`--rows` rows of a WRENCH train split as the
unlabeled rows, `--dev` rows of its valid split as dev, its test split held out; as a user's CSV): import, then
`--generations` offline generations at once (the expert starts evolving as soon as the rows are in), then the soft
labels with the default aggregator and the comparison the Labels screen shows. `background`: the import starts the
embedding job (the product); `inline`: it does not, so the soft labels embed every text themselves (before). Each
mode starts with a cold user cache of its own. Then the same table is imported into a second workspace (the cache
warm) and the seconds its embedding job takes are reported.

    python bench/first_labels.py [--dataset trec] [--rows 3000] [--dev 500] [--modes background inline] [--out FILE]

`$EVOPOOL_EMBEDDER` picks the embedder (the default's, else).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, commit, machine  # noqa: E402
from engine.agents.offline.proposer import OfflineProposer  # noqa: E402
from engine.aggregators.registry import DEFAULT_AGGREGATOR  # noqa: E402
from engine.embed import shared_cache  # noqa: E402
from engine.embed.registry import DEFAULT_EMBEDDER  # noqa: E402
from engine.ingest.importer import IngestOptions  # noqa: E402
from engine.jobs import DONE, JobRegistry, start_evolve, start_import, start_labels  # noqa: E402
from engine.store.workspace import Store  # noqa: E402


def user_table(dataset: str, rows: int, seed: int, dev: int = 500) -> pd.DataFrame:
    """`rows` train rows (unlabeled), `dev` rows of the valid split as dev (the import's default size) and the test
    split as test, as a CSV would give them."""
    names = json.loads((SHARED / dataset / "label.json").read_text())
    parts = []
    for split, role in (("train", "pool"), ("valid", "dev"), ("test", "test")):
        records = json.loads((SHARED / dataset / f"{split}.json").read_text())
        frame = pd.DataFrame([{"id": f"{split}-{key}", "text": r["data"]["text"],
                               "label": "" if role == "pool" else names[str(r["label"])], "split": role}
                              for key, r in records.items()])
        size = {"pool": rows, "dev": dev}.get(role, len(frame))
        parts.append(frame.sample(n=min(size, len(frame)), random_state=seed))
    return pd.concat(parts, ignore_index=True)


def _wait(job, what: str) -> float:
    start = time.monotonic()
    if not job.wait(3600) or job.status != DONE:
        raise SystemExit(f"{what} ended {job.status}: {job.error}")
    return time.monotonic() - start


def flow(home: Path, table: pd.DataFrame, generations: int, background: bool) -> dict:
    """One workspace through import, evolve, soft labels; seconds of each and the soft labels' wait."""
    registry = JobRegistry()
    workdir = home / ("background" if background else "inline")
    opts = IngestOptions(dev_size=len(table[table["split"] == "dev"]))
    started = time.monotonic()
    imported = start_import(workdir, table, opts, dataset="bench", source="table.csv", registry=registry,
                            embed_after=background)
    _wait(imported, "import")
    import_s = time.monotonic() - started
    evolving = start_evolve(workdir, generations, proposer=OfflineProposer(), registry=registry)
    _wait(evolving, "evolve")
    evolve_end = time.monotonic()
    labels = start_labels(workdir, registry=registry)
    saved = workdir / "labels" / f"{DEFAULT_AGGREGATOR}.npz"
    shown = None
    while labels.running:  # the screen draws the labels as soon as they are saved, before the comparison ends
        if shown is None and saved.exists():
            shown = time.monotonic()
        labels.wait(0.2)
    _wait(labels, "soft labels")
    ready = time.monotonic()
    embedding = registry.latest(workdir, "embed")
    return {"mode": "background" if background else "inline", "import_s": round(import_s, 1),
            "evolve_s": round(evolve_end - started - import_s, 1),
            "embed_job_s": None if embedding is None else round(embedding.elapsed_s(), 1),
            "labels_after_last_generation_s": round((shown or ready) - evolve_end, 1),
            "comparison_after_last_generation_s": round(ready - evolve_end, 1)}


def second_workspace(home: Path, table: pd.DataFrame) -> float:
    """Seconds the embedding job of a second import of the same table takes (the user cache warm)."""
    registry = JobRegistry()
    workdir = home / "second"
    imported = start_import(workdir, table, IngestOptions(dev_size=len(table[table["split"] == "dev"])),
                            dataset="bench", source="table-again.csv", registry=registry)
    _wait(imported, "second import")
    embedding = registry.latest(workdir, "embed")
    return round(_wait(embedding, "second embedding"), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="trec")
    parser.add_argument("--rows", type=int, default=3000, help="unlabeled rows (train) besides dev and test")
    parser.add_argument("--dev", type=int, default=500, help="dev rows (of the valid split)")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["background", "inline"], choices=["background", "inline"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "first_labels.md")
    args = parser.parse_args()
    if not (SHARED / args.dataset).is_dir():
        raise SystemExit(f"no {args.dataset} under {SHARED}")
    table = user_table(args.dataset, args.rows, args.seed, args.dev)
    results = []
    with tempfile.TemporaryDirectory(prefix="first-labels-") as scratch:
        for mode in args.modes:
            home = Path(scratch) / mode
            os.environ["EVOPOOL_CACHE"] = str(home / "user-cache")  # cold, and its own
            shared_cache.forget()
            row = flow(home, table, args.generations, mode == "background")
            if mode == "background":
                row["second_workspace_embed_s"] = second_workspace(home, table)
            results.append(row)
            print(json.dumps(row), flush=True)
            Store.close_all()
            shutil.rmtree(home, ignore_errors=True)
    lines = [f"# First soft labels\n\nMeasured {time.strftime('%Y-%m-%d')} at commit {commit()} on {machine()} "
             f"(load average {os.getloadavg()[0]:.1f} at the end) with `python bench/first_labels.py --dataset "
             f"{args.dataset} --rows {args.rows}`: {len(table):,} rows ({args.rows:,} unlabeled, "
             f"{int((table['split'] == 'dev').sum())} dev, {int((table['split'] == 'test').sum())} test), "
             f"{args.generations} offline generations started as soon as the import ends, then the soft labels "
             "with the default aggregator and the comparison the Labels screen shows. Seconds, wall clock.\n",
             "| mode | embedder | import | evolve | embedding job | soft labels shown after the last generation | "
             "their comparison done | second workspace: embedding |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['mode']} | {DEFAULT_EMBEDDER} | {r['import_s']} | {r['evolve_s']} | "
                     f"{r['embed_job_s'] or '–'} | {r['labels_after_last_generation_s']} | "
                     f"{r['comparison_after_last_generation_s']} | {r.get('second_workspace_embed_s', '–')} |")
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
