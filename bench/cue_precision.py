"""How precise a cue is in each view: the figures behind the near view and the veto view, on a WRENCH valid split.

For each `label=cue` given and each view, the rows of the valid split (the rows dev is drawn from; never test)
where the cue fires in that view, as the emitted annotator code reads it (`ViewIndex.fires`: whole words, a
trailing * lets the word continue), and the share of them whose gold label is `label`.

    python bench/cue_precision.py [--dataset chemprot] [--cues Downregulator=inhibit* NOT=not ...]
                                  [--views sentence between near] [--out bench/results/cue_precision]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.throughput import run_meta, save_result  # noqa: E402
from engine.agents.offline.cues import ViewIndex  # noqa: E402
from engine.ingest.readers import read_wrench  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
CUES = ("Downregulator=inhibit*", "Agonist=agonist*", "Antagonist=antagon*", "NOT=not")


def measure(dataset: str, cues: list[str], views: list[str]) -> list[dict]:
    frame, _ = read_wrench(SHARED / dataset)
    valid = frame[frame["split"] == "dev"]
    fields = [c for c in valid.columns if c not in ("id", "text", "label", "split")]
    examples = [{**{f: row[f] for f in fields}, "text": row["text"]} for _, row in valid.iterrows()]
    gold = valid["label"].to_numpy()
    index = ViewIndex(examples, views)
    rows = []
    for item in cues:
        label, cue = item.split("=", 1)
        for view in views:
            fired = index.fires(view, [cue])
            n = int(fired.sum())
            right = int(np.count_nonzero(gold[fired] == label))
            rows.append({"label": label, "cue": cue, "view": view, "fires": n,
                         "precision": round(right / n, 3) if n else None})
    return rows


def markdown(rows: list[dict], meta: dict, dataset: str) -> str:
    lines = ["# Cue precision per view: `bench/cue_precision.py`\n",
             f"Measured {meta['when']} at commit {meta['commit']} on {meta['machine']}. "
             f"Command: `{meta['command'].strip()}`. "
             f"Rows: the whole {dataset} valid split (dev is drawn from it; test is never read).\n",
             "| class | cue | view | rows it fires on | share of them in the class |", "|---|---|---|---|---|"]
    for r in rows:
        share = "–" if r["precision"] is None else f"{100 * r['precision']:.1f} %"
        lines.append(f"| {r['label']} | `{r['cue']}` | {r['view']} | {r['fires']} | {share} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="chemprot")
    parser.add_argument("--cues", nargs="+", default=list(CUES), help="label=cue, the cue as an annotator writes it")
    parser.add_argument("--views", nargs="+", default=["sentence", "between", "near"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cue_precision")
    args = parser.parse_args()
    if not (SHARED / args.dataset).is_dir():
        sys.exit(f"no real data at {SHARED / args.dataset}: this benchmark needs ../shared/data")
    meta = run_meta("cue_precision.py")
    rows = measure(args.dataset, args.cues, args.views)
    save_result(args.out, {"meta": meta, "rows": rows}, markdown(rows, meta, args.dataset))
    print(markdown(rows, meta, args.dataset))


if __name__ == "__main__":
    main()
