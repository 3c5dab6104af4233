"""Kill test: SIGKILL `evopool run` and `evopool export` at random moments and check that nothing breaks.

After every kill: the workspace opens, no committed generation is lost, no vote is stored twice, and the export
path holds either nothing or a complete file (never a partial one). At the end a rerun resumes to the target.

    python bench/kill.py [--kills 200] [--generations 3] [--seed 0] [--max-delay 8]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo" / "youtube_spam.csv"
DEMO_ROWS = 2056


@dataclass
class KillReport:
    kills: int = 0
    export_kills: int = 0
    runs_finished_before_the_kill: int = 0
    problems: list[str] = field(default_factory=list)
    generations_seen: list[int] = field(default_factory=list)
    partial_files_left: int = 0


def evopool(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=ROOT)


def wait_unlocked(db: Path, timeout_s: float = 30.0) -> duckdb.DuckDBPyConnection | None:
    """A read-only connection once the killed process's workers have let go of the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return duckdb.connect(str(db), read_only=True)
        except duckdb.IOException:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)


def check_workspace(workdir: Path, report: KillReport) -> int:
    """The invariants after a kill; returns the number of complete generations."""
    db = workdir / "workspace.duckdb"
    if not db.exists():
        return 0
    con = wait_unlocked(db)
    if con is None:
        report.problems.append("the workspace stayed locked after the kill")
        return 0
    try:
        tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "generations" not in tables:
            return 0
        done = con.execute("SELECT count(*) FROM generations WHERE status = 'complete'").fetchone()[0]
        packed = "vote_chunks" in tables  # votes packed per (annotator, chunk of rows) since migration 007
        twice = con.execute("SELECT count(*) FROM (SELECT annotator_id, " + ("chunk FROM vote_chunks" if packed else
                            "example_id FROM votes") + " GROUP BY 1, 2 HAVING count(*) > 1)").fetchone()[0]
        if twice:
            report.problems.append(f"{twice} votes stored twice")
        rows = con.execute("SELECT count(*) FROM examples").fetchone()[0]
        if rows not in (0, DEMO_ROWS):
            report.problems.append(f"a partial import: {rows} rows")
    except duckdb.Error as exc:
        report.problems.append(f"the workspace does not read: {exc}")
        return 0
    finally:
        con.close()
    if report.generations_seen and done < report.generations_seen[-1]:
        report.problems.append(f"complete generations went from {report.generations_seen[-1]} to {done}")
    report.generations_seen.append(done)
    return done


def check_export(out: Path, report: KillReport) -> None:
    report.partial_files_left = len(list(out.parent.glob(f".{out.name}.partial-*")))
    if not out.exists():
        return
    try:
        frame = pd.read_csv(out, keep_default_na=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the failure being looked for
        report.problems.append(f"the export at its final name does not read: {exc}")
        return
    if len(frame) != DEMO_ROWS:
        report.problems.append(f"the export at its final name has {len(frame)} of {DEMO_ROWS} rows")


def kill_loop(workdir: Path, kills: int, generations: int, seed: int, max_delay: float) -> KillReport:
    """`kills` random SIGKILLs of run (and, once a generation is complete, export); then a rerun to the end."""
    rng = random.Random(seed)
    report = KillReport()
    out = workdir.parent / f"{workdir.name}-labels.csv"
    for _ in range(kills):
        done = report.generations_seen[-1] if report.generations_seen else 0
        exporting = done > 0 and (done >= generations or rng.random() < 0.4)  # nothing left to run: export
        if exporting:
            proc = evopool("export", "--workdir", str(workdir), "--out", str(out), "--aggregator", "mv")
        else:
            target = min(generations, done + 1 + rng.randrange(2))
            proc = evopool("run", str(DEMO), "--workdir", str(workdir), "--generations", str(target))
        try:
            proc.wait(timeout=rng.uniform(0.3, max_delay))
            report.runs_finished_before_the_kill += 1
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            report.kills += 1
            report.export_kills += exporting
        check_workspace(workdir, report)
        if exporting:
            check_export(out, report)
    final = evopool("run", str(DEMO), "--workdir", str(workdir), "--generations", str(generations))
    if final.wait(timeout=900) != 0:
        report.problems.append(f"the rerun after the kills exited {final.returncode}")
    if check_workspace(workdir, report) != generations:
        report.problems.append(f"the rerun did not reach generation {generations}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=8.0, help="longest wait before a kill, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        report = kill_loop(Path(tmp) / "ws", args.kills, args.generations, args.seed, args.max_delay)
    print(f"{report.kills} kills ({report.export_kills} of export), {report.runs_finished_before_the_kill} "
          "commands finished first, "
          f"generations seen {report.generations_seen[-10:]}, partial export files left "
          f"{report.partial_files_left}, {time.monotonic() - started:.0f}s")
    for problem in report.problems:
        print("PROBLEM:", problem)
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
