"""Headless, from nothing to labels: `evopool run DATA` with its defaults (5 offline generations), then
`evopool export`, in a fresh workspace with a cold user cache of embeddings; then the same two commands into a second
workspace on the same data (the cache warm). Seconds of each command, wall clock, as a user at a terminal sees them.

    python bench/headless_flow.py [--data ../shared/data/chemprot] [--out bench/results/headless_flow.md]
"""
from __future__ import annotations

import argparse
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


def timed(*args: str, env: dict[str, str]) -> float:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"evopool {args[0]} exited {out.returncode}: {out.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=SHARED / "chemprot")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "headless_flow.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="headless-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "EVOPOOL_CACHE": f"{tmp}/cache"}
        for which in ("first workspace, cold cache", "second workspace, same data"):
            workdir = Path(tmp) / which.split(",")[0].replace(" ", "-")
            run_s = timed("run", str(args.data), "--workdir", str(workdir), env=env)
            export_s = timed("export", "--workdir", str(workdir), "--out", str(workdir / "labels.csv"), env=env)
            rows.append({"which": which, "run_s": round(run_s, 1), "export_s": round(export_s, 1),
                         "total_s": round(run_s + export_s, 1)})
            print(json.dumps(rows[-1]), flush=True)
    lines = [f"# Headless: run, then export\n\nMeasured {time.strftime('%Y-%m-%d')} at commit {commit()} on "
             f"{machine()} "
             f"(load average {os.getloadavg()[0]:.1f} at the end) with `python bench/headless_flow.py --data "
             f"{args.data.name}`: `evopool run` with its defaults (5 offline generations), then `evopool export` "
             "(default aggregator), a cold user cache of embeddings for the first workspace. Seconds, wall clock.\n",
             "| workspace | run | export | in all |", "|---|---|---|---|"]
    lines += [f"| {r['which']} | {r['run_s']} | {r['export_s']} | {r['total_s']} |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
