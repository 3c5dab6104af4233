"""What every bench shares: where the real data lives, the machine and the commit a result names."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"  # the WRENCH datasets (../shared/data/README.md)

# the code a bench measures: a result file names the commit, and says so when this code differed from it (the
# environment's files, pyproject.toml and constraints.txt, are not the code measured; the results are what it writes)
CODE_PATHS = ("engine", "studio", "pages", "bench", ":(exclude)bench/results")


def machine() -> str:
    """The cores and the CPU model, as a result file names the machine."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores, {cpu}"


def commit() -> str:
    """The short commit hash, with "+uncommitted" when the code under CODE_PATHS has changes not committed (new
    files git does not ignore included: a bench script run before it is committed); "unknown" outside a repository."""
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all", "--",
                                  *CODE_PATHS], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+uncommitted" if changed else "")
