"""How long the expert waits on the queue at corpus size, through the CLI as a user runs it: `evopool suggest` on a
16K-row workspace (ChemProt, 5 offline generations), the first time (the rows embedded) and again (embeddings cached),
then `evopool teach` of the 25 rows suggested (answered from the pool rows' withheld train labels, as
bench/expert_loop.py does; the annotators vote on them and are rescored), then `suggest` once more. Seconds, wall
clock.

    python bench/queue_speed.py [--data chemprot] [--n 25] [--out bench/results/queue_speed.md]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, commit, machine  # noqa: E402
from bench.student_validation import pool_gold  # noqa: E402
from engine.store.workspace import Store  # noqa: E402


def evopool(*args: str, env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"evopool {args[0]} exited {out.returncode}: {out.stderr[-2000:]}")
    return time.monotonic() - start, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="chemprot")
    parser.add_argument("--n", type=int, default=25)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "queue_speed.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="queue-speed-") as tmp:
        ws = f"{tmp}/ws"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "EVOPOOL_CACHE": f"{tmp}/cache",
               "EVOPOOL_EXPERT": "queue_speed bench"}
        run_s, _ = evopool("run", str(SHARED / args.data), "--workdir", ws, env=env)
        store = Store.open(ws)
        rows, labels = store.count_examples(), store.load_task().labels
        Store.close_all()
        first_s, _ = evopool("suggest", "--workdir", ws, "--n", str(args.n), env=env)
        again_s, out = evopool("suggest", "--workdir", ws, "--n", str(args.n), env=env)
        ids = [json.loads(line)["id"] for line in out.splitlines() if line.startswith("{")]
        gold = pool_gold(args.data, ids, labels)
        answers = Path(tmp) / "answers.csv"
        with answers.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "label"])
            writer.writerows((i, labels[g]) for i, g in zip(ids, gold, strict=True))
        teach_s, taught = evopool("teach", "--workdir", ws, str(answers), env=env)
        after_s, _ = evopool("suggest", "--workdir", ws, "--n", str(args.n), env=env)
    added = json.loads(taught.strip().splitlines()[-1])["added"]
    figures = {"dataset": args.data, "rows": rows, "n": args.n, "run_s": round(run_s, 1),
               "suggest_first_s": round(first_s, 1), "suggest_cached_s": round(again_s, 1),
               "teach_s": round(teach_s, 1), "taught": added, "suggest_after_teach_s": round(after_s, 1),
               "machine": machine(), "commit": commit(), "load": os.getloadavg()[0]}
    print(json.dumps(figures))
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    args.out.write_text(
        f"# The queue at corpus size\n\nMeasured {time.strftime('%Y-%m-%d')} at commit {figures['commit']} on "
        f"{figures['machine']} (load average {figures['load']:.1f} at the end) with `python bench/queue_speed.py "
        f"--data {args.data} --n {args.n}`: a {rows:,}-row workspace after `evopool run` (5 offline generations, "
        f"{figures['run_s']} s). Seconds, wall clock, each a fresh `evopool` process (its start included).\n\n"
        "| step | seconds |\n|---|---|\n"
        f"| `suggest --n {args.n}`, first (every row embedded) | {figures['suggest_first_s']} |\n"
        f"| `suggest --n {args.n}` again (embeddings cached) | {figures['suggest_cached_s']} |\n"
        f"| `teach` of the {added} rows suggested (they join dev; the annotators vote on them, rescored) | "
        f"{figures['teach_s']} |\n"
        f"| `suggest --n {args.n}` after the teach | {figures['suggest_after_teach_s']} |\n")


if __name__ == "__main__":
    main()
