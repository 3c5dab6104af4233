"""Kill test: SIGKILL `evopool run`, `evopool export` and `evopool teach` at random moments and check that nothing
breaks.

After every kill: the workspace opens, no committed generation is lost, no vote is stored twice, the export path
holds either nothing or a complete file (never a partial one), and a teach of 5 rows left all 5 in dev with the
expert's record or none (never some). At the end a rerun resumes to the target. The result goes to
bench/results/kill.md.

    python bench/kill.py [--kills 200] [--generations 3] [--seed 0] [--max-delay 8]
"""
from __future__ import annotations

import argparse
import json
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
    teach_kills: int = 0
    teach_rows_checked: int = 0
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


def teach_file(workdir: Path, rng: random.Random, path: Path) -> list[str]:
    """A CSV of 5 unlabeled rows with labels (any: the bench checks the writing, not the labels); their ids."""
    con = wait_unlocked(workdir / "workspace.duckdb")
    if con is None:
        return []
    try:
        ids = [r[0] for r in con.execute("SELECT id FROM examples WHERE split = 'pool' ORDER BY id").fetchall()]
        labels = json.loads(con.execute("SELECT labels FROM task").fetchone()[0])
    finally:
        con.close()
    picked = rng.sample(ids, 5)
    path.write_text("id,label\n" + "".join(f"{i},{rng.choice(labels)}\n" for i in picked))
    return picked


def check_teach(workdir: Path, ids: list[str], report: KillReport) -> None:
    """All of a teach's rows in dev with the expert's record, or none of them."""
    con = wait_unlocked(workdir / "workspace.duckdb")
    if con is None:
        report.problems.append("the workspace stayed locked after a teach")
        return
    try:
        marks = ", ".join("?" * len(ids))
        in_dev = con.execute(f"SELECT count(*) FROM examples WHERE split = 'dev' AND id IN ({marks})",
                             ids).fetchone()[0]
        recorded = con.execute(f"SELECT count(*) FROM expert_labels WHERE example_id IN ({marks})",
                               ids).fetchone()[0]
    finally:
        con.close()
    report.teach_rows_checked += len(ids)
    if (in_dev, recorded) not in ((0, 0), (len(ids), len(ids))):
        report.problems.append(f"a killed teach left {in_dev} of {len(ids)} rows in dev, {recorded} recorded")


def kill_loop(workdir: Path, kills: int, generations: int, seed: int, max_delay: float) -> KillReport:
    """`kills` random SIGKILLs of run (and, once a generation is complete, export); then a rerun to the end."""
    rng = random.Random(seed)
    report = KillReport()
    out = workdir.parent / f"{workdir.name}-labels.csv"
    for _ in range(kills):
        done = report.generations_seen[-1] if report.generations_seen else 0
        exporting = done > 0 and (done >= generations or rng.random() < 0.4)  # nothing left to run: export
        teaching = exporting and rng.random() < 0.4  # or teach: it needs a workspace with data, as export does
        taught: list[str] = []
        if teaching:
            exporting = False
            taught = teach_file(workdir, rng, workdir.parent / "teach.csv")
            proc = evopool("teach", "--workdir", str(workdir), str(workdir.parent / "teach.csv"), "--by", "kill bench")
        elif exporting:
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
            report.teach_kills += teaching
        check_workspace(workdir, report)
        if exporting:
            check_export(out, report)
        if taught:
            check_teach(workdir, taught, report)
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
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kill.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        report = kill_loop(Path(tmp) / "ws", args.kills, args.generations, args.seed, args.max_delay)
    seconds = time.monotonic() - started
    summary = (f"{report.kills} kills ({report.export_kills} of export, {report.teach_kills} of teach, the rest of "
               f"run), {report.runs_finished_before_the_kill} commands finished first, {report.teach_rows_checked} "
               f"taught rows checked, generations seen {report.generations_seen[-10:]}, partial export files left "
               f"{report.partial_files_left}, {seconds:.0f}s")
    print(summary)
    for problem in report.problems:
        print("PROBLEM:", problem)
    args.out.write_text(f"# Kill test\n\nMeasured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores with "
                        f"`python bench/kill.py --kills {args.kills} --generations {args.generations} --seed "
                        f"{args.seed} --max-delay {args.max_delay}`.\n\n{summary}.\n\nProblems found: "
                        + ("; ".join(report.problems) if report.problems else "none") + ".\n")
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
