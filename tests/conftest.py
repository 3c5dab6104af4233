"""Shared fixtures: the bundled demo, ../shared/data (skipped where absent), fresh workspaces."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer

from engine.store.workspace import Store

ROOT = Path(__file__).resolve().parents[1]
DEMO_CSV = ROOT / "data" / "demo" / "youtube_spam.csv"
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real WRENCH data not found at {SHARED_DATA} (CI has it; see ../shared/data/README.md)")
    return SHARED_DATA


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
