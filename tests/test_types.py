"""Types are checked in the test run: mypy (settings in pyproject.toml) finds no error in engine/, and in studio/ and
pages/ none beyond tests/mypy_baseline.txt, a list that may only shrink: an error fixed must leave it too.

An error is named without its line number (file, message, code), so an edit elsewhere in a file does not move it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "mypy_baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:]+):\d+(?::\d+)?: error: (?P<message>.*)$")


def errors_of(report: str) -> list[str]:
    """'path: message [code]' of each error in mypy's report, in its order (notes and the summary left out)."""
    return [f"{m['path']}: {m['message']}" for line in report.splitlines() if (m := ERROR.match(line))]


def verdict(errors: list[str], baseline: list[str]) -> list[str]:
    """What fails the check: any error in engine/, an error of studio/ or pages/ not in the baseline (as many
    times as it occurs there, at most), and a baseline entry no longer found (fixed: take it out of the file)."""
    problems = [f"engine/ must type-check: {e}" for e in errors if e.startswith("engine/")]
    left = list(baseline)
    for error in (e for e in errors if not e.startswith("engine/")):
        if error in left:
            left.remove(error)
        else:
            problems.append(f"new type error (fix it; the baseline may only shrink): {error}")
    problems += [f"fixed, so take it out of {BASELINE.name}: {entry}" for entry in left]
    return problems


def test_the_verdict_catches_engine_errors_new_errors_and_stale_baseline_entries():
    report = ("engine/gate.py:12: error: Name \"x\" is not defined  [name-defined]\n"
              "studio/a.py:3: error: old one  [misc]\n"
              "studio/a.py:9: note: a note\n"
              "pages/b.py:7:5: error: new one  [arg-type]\n"
              "Found 3 errors in 3 files (checked 9 source files)\n")
    errors = errors_of(report)
    assert errors == ['engine/gate.py: Name "x" is not defined  [name-defined]', "studio/a.py: old one  [misc]",
                      "pages/b.py: new one  [arg-type]"]
    problems = verdict(errors, ["studio/a.py: old one  [misc]", "studio/c.py: gone  [misc]"])
    assert problems == ['engine/ must type-check: engine/gate.py: Name "x" is not defined  [name-defined]',
                        "new type error (fix it; the baseline may only shrink): pages/b.py: new one  [arg-type]",
                        "fixed, so take it out of mypy_baseline.txt: studio/c.py: gone  [misc]"]
    assert verdict(errors[1:2], ["studio/a.py: old one  [misc]"]) == []


def test_mypy_finds_nothing_beyond_the_baseline(monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is part of the test extra: make setup installs it")
    monkeypatch.chdir(ROOT)  # the settings name the folders relative to the project (its cache: .mypy_cache)
    stdout, stderr, _status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
                                       "--hide-error-context"])
    assert not stderr.strip(), stderr
    baseline = [line for line in BASELINE.read_text(encoding="utf-8").splitlines() if line and line[0] != "#"]
    problems = verdict(errors_of(stdout), baseline)
    assert not problems, "\n".join(problems)
