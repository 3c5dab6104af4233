"""Shared fixtures: the bundled demo, ../shared/data (skipped where absent), fresh workspaces."""
from __future__ import annotations

import base64
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fake_openai_server import FakeOpenAIServer

from engine.store.workspace import Store

ROOT = Path(__file__).resolve().parents[1]
DEMO_CSV = ROOT / "data" / "demo" / "youtube_spam.csv"
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the user cache of embeddings (engine/embed/shared_cache.py): one per test process, never the user's own
os.environ.setdefault("EVOPOOL_CACHE", tempfile.mkdtemp(prefix="evopool-test-cache-"))


# The longest files (a minute or more each: a Ray cluster, `evopool` subprocesses, AppTest on evolved workspaces),
# longest first: `make test` runs the suite on two pytest-xdist workers, whole files to a worker (--dist loadfile,
# --no-loadscope-reorder), and a long file started last would leave one worker idle at the end.
LONGEST_FIRST = ["test_e2e_browser.py", "test_corpus_ray.py", "test_types.py", "test_cli.py", "test_pages.py",
                 "test_corpus.py", "test_figures_agree.py", "test_evolve.py", "test_export_formats.py",
                 "test_aggregators.py", "test_llm_runs.py", "test_multilabel.py", "test_kill.py", "test_student.py",
                 "test_compiled.py", "test_jobs.py", "test_experts.py", "test_workspaces.py"]


# The integration tier: files that drive the CLI as subprocesses, evolved workspaces under AppTest, kill loops, a Ray
# cluster or mypy. Marked `heavy`; `make test-fast` leaves them out (and the browser), `make test` runs them.
HEAVY = {"test_e2e_browser.py", "test_corpus_ray.py", "test_cli.py", "test_pages.py", "test_corpus.py",
         "test_figures_agree.py", "test_export_formats.py", "test_llm_runs.py", "test_multilabel.py", "test_kill.py",
         "test_jobs.py", "test_experts.py", "test_workspaces.py", "test_types.py", "test_llm_endpoint_gone.py",
         "test_label_queue.py", "test_evolve.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files in LONGEST_FIRST's order, then the rest as collected (a test's order within its file is kept); the
    HEAVY files' tests marked `heavy`."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    for item in items:
        if item.path.name in HEAVY:
            item.add_marker(pytest.mark.heavy)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real WRENCH data not found at {SHARED_DATA} (CI has it; see ../shared/data/README.md)")
    return SHARED_DATA


@pytest.fixture
def default_csv_limit() -> Iterator[None]:
    """csv's cell limit as a fresh process has it (131,072 characters): another test's read may have raised it."""
    before = csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(before)


@pytest.fixture
def demo_csv() -> Path:
    return DEMO_CSV


@pytest.fixture
def fake_openai():
    """A scripted OpenAI-compatible HTTP server on 127.0.0.1 (see fake_openai_server.py)."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path):
    """An empty workspace on a real DuckDB file."""
    yield Store.open(tmp_path / "ws")
    Store.close_all()


def charts(at) -> list[dict]:
    """Every plotly chart on an AppTest's screen, as its JSON spec."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def values(array: list | dict) -> list:
    """A plotly trace's values: plotly writes numeric arrays typed (base64 `bdata` and a dtype), others as lists."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


@contextmanager
def held_by_another_process(workdir: Path) -> Iterator[None]:
    """The workspace at `workdir` held open by another process (an `evopool run`) for the block's length."""
    script = ("import time; from engine.store.workspace import Store; "
              f"Store.open({str(workdir)!r}); print('open', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        yield
    finally:
        holder.kill()
        holder.wait()
