"""Workspaces as a set: list with what each holds, rename, delete into the trash and restore; from the engine, the
command line and the studio's Project screen. A workspace another process holds is never moved."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, held_by_another_process
from streamlit.testing.v1 import AppTest

from engine.expert import review
from engine.ingest.importer import IngestOptions, import_path
from engine.store import workspaces
from engine.store.workspace import Store, WorkspaceLocked

APP = str(ROOT / "streamlit_app.py")


def _with_rows(home: Path, name: str, demo_csv: Path) -> Store:
    store = Store.open(home / name)
    import_path(store, demo_csv, IngestOptions())
    return store


def test_holding_counts_rows_and_expert_verdicts_and_tells_an_empty_workspace(tmp_path, demo_csv):
    store = _with_rows(tmp_path, "spam", demo_csv)
    Store.open(tmp_path / "empty")
    review.approve(store, "a1", "looks right")  # the verdict log is what is counted
    dev_rows = store.split_counts()["dev"]
    Store.close(tmp_path / "spam")  # read from the file, as for a workspace this process never opened
    held = workspaces.holding(tmp_path, "spam")
    assert (held.rows, held.pool, held.expert_actions) == (store_rows := 2056, 1, 1) and not held.empty
    assert held.dev_rows == dev_rows == 120 and held.bytes_on_disk > 0
    assert f"{store_rows:,} rows" in held.sentence() and "1 expert action" in held.sentence()
    assert workspaces.holding(tmp_path, "empty").empty
    assert workspaces.names(tmp_path) == ["empty", "spam"]


def test_delete_moves_to_the_trash_and_restore_brings_it_back_whole(tmp_path, demo_csv):
    store = _with_rows(tmp_path, "spam", demo_csv)
    dev_before = store.split_counts()
    where = workspaces.delete(tmp_path, "spam")
    assert workspaces.names(tmp_path) == [] and where.parent.name == workspaces.TRASH
    assert workspaces.trashed(tmp_path, "spam") == [where]
    assert workspaces.restore(tmp_path, where) == "spam"
    assert Store.open(tmp_path / "spam").split_counts() == dev_before  # a fresh connection reads what was there
    assert workspaces.trashed(tmp_path) == []


def test_rename_keeps_the_rows_and_refuses_a_taken_or_bad_name(tmp_path, demo_csv):
    _with_rows(tmp_path, "spam", demo_csv)
    Store.open(tmp_path / "other")
    with pytest.raises(FileExistsError):
        workspaces.rename(tmp_path, "spam", "other")
    with pytest.raises(ValueError, match="bad workspace name"):
        workspaces.rename(tmp_path, "spam", "../outside")
    with pytest.raises(ValueError, match="bad workspace name"):
        workspaces.delete(tmp_path, "../spam")
    workspaces.rename(tmp_path, "spam", "comments")
    assert workspaces.names(tmp_path) == ["comments", "other"]
    assert Store.open(tmp_path / "comments").count_examples() == 2056


def test_a_workspace_another_process_holds_is_listed_in_use_and_neither_deleted_nor_renamed(tmp_path, demo_csv):
    _with_rows(tmp_path, "spam", demo_csv)
    Store.close(tmp_path / "spam")
    with held_by_another_process(tmp_path / "spam"):
        assert workspaces.holding(tmp_path, "spam").rows is None
        with pytest.raises(WorkspaceLocked, match="in use by another process"):
            workspaces.delete(tmp_path, "spam")
        with pytest.raises(WorkspaceLocked):
            workspaces.rename(tmp_path, "spam", "moved")
    assert workspaces.names(tmp_path) == ["spam"] and not (tmp_path / workspaces.TRASH).exists()


def _evopool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_cli_lists_renames_deletes_and_restores(tmp_path, demo_csv):
    _with_rows(tmp_path, "spam", demo_csv)
    Store.open(tmp_path / "empty")
    Store.close_all()
    home = ["--home", str(tmp_path)]
    listed = [json.loads(line) for line in _evopool("workspace", "list", *home).stdout.splitlines()]
    assert [(w["name"], w["rows"]) for w in listed] == [("empty", 0), ("spam", 2056)]
    assert json.loads(_evopool("workspace", "mv", "spam", "comments", *home).stdout) == {"renamed": "spam",
                                                                                          "to": "comments"}
    out = _evopool("workspace", "rm", "comments", *home)
    assert out.returncode == 0 and "evopool workspace restore comments" in out.stderr
    assert workspaces.names(tmp_path) == ["empty"]
    assert json.loads(_evopool("workspace", "restore", "comments", *home).stdout) == {"restored": "comments"}
    missing = _evopool("workspace", "rm", "nothing-here", *home)
    assert missing.returncode == 1 and "no workspace at" in missing.stderr
    assert _evopool("workspace", "mv", "comments", *home).returncode == 2  # mv takes two names


def _run(ws: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if ws:
        at.query_params["ws"] = ws
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_picker_leaves_out_empty_workspaces_and_the_project_screen_deletes_with_undo(tmp_path, monkeypatch,
                                                                                        demo_csv):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path))
    _with_rows(tmp_path, "spam", demo_csv)
    Store.open(tmp_path / "failed-upload")  # created, then its upload failed: nothing in it
    at = _run("spam")
    assert at.sidebar.selectbox(key="ws_picker").options == ["spam"]
    listed = next(d.value for d in at.dataframe if "workspace" in d.value.columns)  # the manage panel lists it
    assert dict(zip(listed["workspace"], listed["state"], strict=True)) == {"failed-upload": "empty", "spam": ""}
    at.selectbox(key="delete_ws_pick").select("spam").run()
    at.button(key="delete_ws").click().run()
    at.button(key="yes_delete_workspace").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert workspaces.names(tmp_path) == ["failed-upload"] and "ws" not in at.query_params
    at.button(key="undo_delete_ws").click().run()
    assert workspaces.names(tmp_path) == ["failed-upload", "spam"]
    assert at.query_params["ws"] == "spam" and Store.open(tmp_path / "spam").count_examples() == 2056
