"""A bench result names the commit it measured, and says so when the measured code was not committed."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

# bench/ is scripts, not an installed package: load the file as the command line runs it
_FILE = Path(__file__).resolve().parents[1] / "bench" / "common.py"
_SPEC = importlib.util.spec_from_file_location("bench_common", _FILE)
common = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(common)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _scratch_git(tmp_path, monkeypatch) -> None:
    """git here sees only the scratch repository: no inherited repository, no parent checkout, no signing."""
    for name in ("GIT_DIR", "GIT_INDEX_FILE", "GIT_WORK_TREE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))


def test_the_commit_says_uncommitted_when_the_code_differs_but_not_for_results(tmp_path, monkeypatch):
    _scratch_git(tmp_path, monkeypatch)
    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "engine" / "gate.py").write_text("MIN_GAIN = 0.006\n")
    (repo / "bench" / "results" / "pool_gap.md").write_text("before\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-qm", "first")
    sha = _git(repo, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(common, "ROOT", repo)
    assert common.commit() == sha
    (repo / "bench" / "results" / "pool_gap.md").write_text("a bench wrote its result\n")
    assert common.commit() == sha  # a result file is not the code measured
    (repo / "bench" / "new_bench.py").write_text("print('run before it was committed')\n")
    assert common.commit() == sha + "+uncommitted"  # a new file git does not ignore
    (repo / "bench" / "new_bench.py").unlink()
    (repo / "engine" / "gate.py").write_text("MIN_GAIN = 0.003\n")
    assert common.commit() == sha + "+uncommitted"


def test_the_commit_is_unknown_outside_a_repository(tmp_path, monkeypatch):
    _scratch_git(tmp_path, monkeypatch)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    assert common.commit() == "unknown"


_QUALITY = importlib.util.spec_from_file_location("quality", _FILE.parent / "quality.py")
quality = importlib.util.module_from_spec(_QUALITY)
_QUALITY.loader.exec_module(quality)


def test_a_quality_table_names_the_commits_its_rows_ran_at_not_the_one_it_was_merged_at():
    assert quality.measured_at([{"commit": "abc"}, {"commit": "abc"}]) == "abc"
    assert quality.measured_at([{"commit": "def"}, {"commit": "abc"}]) == "abc, def"
    assert quality.measured_at([{"dataset": "sms"}]) == "unknown"  # written before rows recorded it
