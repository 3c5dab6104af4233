"""A bench result names the commit it measured, and says so when the measured code was not committed."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

# bench/ is scripts, not an installed package: load the file as the command line runs it
_FILE = Path(__file__).resolve().parents[1] / "bench" / "throughput.py"
_SPEC = importlib.util.spec_from_file_location("throughput", _FILE)
throughput = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(throughput)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_says_uncommitted_when_the_code_differs_but_not_for_results(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "engine" / "gate.py").write_text("MIN_GAIN = 0.006\n")
    (repo / "bench" / "results" / "pool_gap.md").write_text("before\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    sha = _git(repo, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(throughput, "ROOT", repo)
    assert throughput.commit() == sha
    (repo / "bench" / "results" / "pool_gap.md").write_text("a bench wrote its result\n")
    assert throughput.commit() == sha  # a result file is not the code measured
    (repo / "engine" / "gate.py").write_text("MIN_GAIN = 0.003\n")
    assert throughput.commit() == sha + "+uncommitted"


def test_the_commit_is_unknown_outside_a_repository(tmp_path, monkeypatch):
    monkeypatch.setattr(throughput, "ROOT", tmp_path)
    assert throughput.commit() == "unknown"
