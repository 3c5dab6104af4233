"""The queue of rows worth labeling and the CLI's `suggest` / `teach`, on a workspace evolved from the demo."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DEMO_CSV

from engine.agents.offline.proposer import OfflineProposer
from engine.apply.executor import CompiledExecutor
from engine.cli import main
from engine.evolve import evolve
from engine.expert.queue import Suggestion, _diverse, read_teach_csv, suggest_rows
from engine.ingest.importer import IngestOptions, import_path
from engine.store.workspace import Store


@pytest.fixture(scope="module")
def evolved(tmp_path_factory) -> Path:
    """The demo imported and evolved one generation: copied per test that writes."""
    path = tmp_path_factory.mktemp("queue") / "ws"
    store = Store.open(path)
    import_path(store, DEMO_CSV, IngestOptions())
    with CompiledExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
    Store.close_all()
    return path


@pytest.fixture
def workspace(evolved, tmp_path) -> Path:
    copy = tmp_path / "ws"
    shutil.copytree(evolved, copy)
    return copy


def evopool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=600)


def test_suggest_prints_unlabeled_rows_best_first_with_the_reason(workspace):
    out = evopool("suggest", "--workdir", str(workspace), "--n", "12")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    assert all(set(r) >= {"id", "text", "why"} and r["why"] for r in rows)
    scores = [r["score"] for r in rows]
    assert scores[0] == max(scores)
    store = Store.open(workspace)
    assert set(store.examples_frame(ids=[r["id"] for r in rows])["split"]) == {"pool"}
    drawn = evopool("suggest", "--workdir", str(workspace), "--n", "12", "--strategy", "random")
    randomly = [json.loads(line)["id"] for line in drawn.stdout.splitlines()]
    assert set(randomly) != {r["id"] for r in rows}


def test_the_queue_spreads_its_picks_over_clusters():
    rng = np.random.default_rng(0)
    centre = rng.normal(size=8)
    near_copies = centre + rng.normal(0, 0.01, (30, 8))  # one cluster, all scored highest
    others = rng.normal(size=(30, 8))
    embed = np.vstack([near_copies, others])
    score = np.r_[np.full(30, 1.0), np.full(30, 0.5)]
    picked = _diverse(score, embed, 5)
    assert sum(p < 30 for p in picked) == 1 and len(set(picked)) == 5


def test_teach_adds_rows_to_dev_and_the_next_suggestions_move_on(workspace, tmp_path):
    store = Store.open(workspace)
    labels = store.load_task().labels
    dev_before = store.count_examples("dev")
    with CompiledExecutor() as executor:
        first = suggest_rows(store, executor, 5)
    Store.close_all()
    csv = tmp_path / "labels.csv"
    csv.write_text("id,label\n" + "".join(f"{s.id},{labels[i % 2]}\n" for i, s in enumerate(first)))
    out = evopool("teach", "--workdir", str(workspace), str(csv), "--by", "ana")
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["added"] == 5 and said["per_class"] == {labels[0]: 3, labels[1]: 2}
    store = Store.open(workspace)
    assert store.count_examples("dev") == dev_before + 5 == said["dev_rows"]
    moved = store.examples_frame(ids=[s.id for s in first])
    assert set(moved["split"]) == {"dev"} and not moved["audit"].any()  # fitness rows, never audit or test
    with CompiledExecutor() as executor:
        after = suggest_rows(store, executor, 5)
    assert not {s.id for s in after} & {s.id for s in first}


@pytest.mark.parametrize("body, message", [
    ("id,label\nnope-1,{a}\n", "no row with id 'nope-1'"),
    ("id,label\n{pool},NOT_A_LABEL\n", "not in the label set"),
    ("id,label\n{dev},{a}\n", "is in dev"),
    ("id,label\n{test},{a}\n", "is in test"),
    ("id,label\n{pool},{a},extra\n", "line 2: 3 fields"),
    ("label,id\n{pool},{a}\n", "header must be `id,label`"),
    ("id,label\n{pool},{a}\n{pool},{b}\n", "labeled twice"),
])
def test_teach_refuses_bad_input_and_writes_nothing(workspace, tmp_path, body, message, capsys):
    store = Store.open(workspace)
    labels = store.load_task().labels
    ids = {split: store.example_ids(split)[0] for split in ("pool", "dev", "test")}
    before = {split: store.count_examples(split) for split in ("pool", "dev", "test")}
    Store.close_all()
    csv = tmp_path / "labels.csv"
    csv.write_text(body.format(a=labels[0], b=labels[1], **ids))
    # the CLI in this process (its parsing, checks and exit code; a subprocess per case cost ~15 s of imports)
    assert main(["teach", "--workdir", str(workspace), str(csv), "--by", "ana"]) == 1
    said = capsys.readouterr().err
    assert message in said and said.startswith("error: "), said
    Store.close_all()
    store = Store.open(workspace)
    assert {split: store.count_examples(split) for split in ("pool", "dev", "test")} == before


def test_a_bad_row_after_good_ones_keeps_the_good_ones_out_too(workspace, tmp_path, capsys):
    store = Store.open(workspace)
    labels = store.load_task().labels
    pool = store.example_ids("pool")[:3]
    dev_before = store.count_examples("dev")
    Store.close_all()
    csv = tmp_path / "labels.csv"
    csv.write_text("id,label\n" + "".join(f"{i},{labels[0]}\n" for i in pool) + "ghost,HAM\n")
    assert main(["teach", "--workdir", str(workspace), str(csv)]) == 1
    assert "ghost" in capsys.readouterr().err
    Store.close_all()
    assert Store.open(workspace).count_examples("dev") == dev_before


def test_read_teach_csv_names_the_line(tmp_path):
    csv = tmp_path / "l.csv"
    csv.write_text("id,label\na,X\n\nb,\n")
    with pytest.raises(ValueError, match="line 4: an empty label"):
        read_teach_csv(csv)
    csv.write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_teach_csv(csv)
    assert Suggestion("a", "t", "why", 0.123456).to_dict()["score"] == 0.1235
