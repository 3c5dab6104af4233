"""A handful of SIGKILLs of real `evopool run` / `export` processes (bench/kill.py runs 200): the workspace
always opens, nothing committed is lost or doubled, the rerun resumes, and no export looks complete unless it is."""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_kill_bench():
    spec = importlib.util.spec_from_file_location("kill_bench", ROOT / "bench" / "kill.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_random_kills_of_run_and_export_lose_nothing_and_the_rerun_resumes(tmp_path):
    report = load_kill_bench().kill_loop(tmp_path / "ws", kills=5, generations=2, seed=3, max_delay=15.0)
    assert report.problems == []
    assert report.generations_seen[-1] == 2
    assert report.kills + report.runs_finished_before_the_kill == 5


def test_an_export_killed_while_writing_leaves_no_file_at_its_name(tmp_path):
    out = tmp_path / "labels.csv"
    script = ("import sys\nfrom pathlib import Path\nfrom engine.atomic import write_atomically\n"
              "print('writing', flush=True)\nwrite_atomically(Path(sys.argv[1]), b'x' * (1 << 30))\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".labels.csv.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # only the hidden partial file, never a short file at the final name
    assert [p.name.startswith(".labels.csv.partial-") for p in tmp_path.iterdir()] in ([], [True])


def test_a_teach_killed_at_any_moment_leaves_all_its_rows_in_dev_or_none(tmp_path):
    import random

    bench = load_kill_bench()
    workdir = tmp_path / "ws"
    assert bench.evopool("run", str(bench.DEMO), "--workdir", str(workdir), "--generations", "1").wait(600) == 0
    rng = random.Random(0)
    for delay in (0.5, 1.5, 3.0, 6.0, 60.0):  # the last one is not cut: its rows land
        report = bench.KillReport()
        taught = bench.teach_file(workdir, rng, tmp_path / "teach.csv")
        proc = bench.evopool("teach", "--workdir", str(workdir), str(tmp_path / "teach.csv"), "--by", "kill test")
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        bench.check_teach(workdir, taught, report)
        assert report.problems == [] and report.teach_rows_checked == 5
    assert proc.returncode == 0  # the uncut one
