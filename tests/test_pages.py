"""Every studio screen under Streamlit's AppTest, on real workspaces (DuckDB files, offline agents, the sandbox).

The seeded workspace is the bundled demo after two generations of the offline agents. Tests that change
a workspace get their own copy, seeded the same way.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from conftest import charts, held_by_another_process, values
from streamlit.testing.v1 import AppTest

from engine.agents.offline.proposer import OfflineProposer
from engine.domain import AUDIT, FITNESS, SoftLabels
from engine.evolve import current_dev_macro_f1, evolve, pool_audit_estimate
from engine.expert import review
from engine.export import files as export
from engine.ingest.importer import IngestOptions, import_path
from engine.jobs import REGISTRY, start_labels
from engine.markdown import escape_md
from engine.metrics import score
from engine.sandbox.executor import SandboxExecutor
from engine.store.saved_labels import load_labels
from engine.store.workspace import DB_NAME, Store
from studio import labels_ui

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "streamlit_app.py")
DEMO = ROOT / "data" / "demo" / "youtube_spam.csv"
SEEDED = "seeded"


def evolved(workdir: Path, generations: int, options: IngestOptions | None, data: Path) -> Store:
    store = Store.open(workdir)
    import_path(store, data, options or IngestOptions())
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, generations)
    return store


SEEDS: dict[tuple[int, str], Path] = {}  # the demo evolved once per (generations, options), then copied per seed()
SEEDS_DIR: list[Path] = []  # set by `home`


def seed(home: Path, name: str, generations: int = 2, options: IngestOptions | None = None,
         data: Path = DEMO) -> Store:
    """`data` imported into `home / name` and evolved `generations` times by the offline agents. A demo seed is a copy
    of the workspace evolved the same way once per module (the offline agents, the gate and the import are seeded, so
    an evolve again gives the same workspace); another file is evolved each time."""
    if data != DEMO or not SEEDS_DIR:
        return evolved(home / name, generations, options, data)
    key = (generations, repr(options or IngestOptions()))
    if key not in SEEDS:
        made = SEEDS_DIR[0] / f"seed{len(SEEDS)}"
        evolved(made, generations, options, data)
        with duckdb.connect(str(made / DB_NAME)) as conn:  # this process's instance of the file: its WAL written in
            conn.execute("CHECKPOINT")
        SEEDS[key] = made
    shutil.copytree(SEEDS[key], home / name, ignore=shutil.ignore_patterns("*.wal"))
    return Store.open(home / name)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Iterator[Path]:
    SEEDS.clear()
    SEEDS_DIR[:] = [tmp_path_factory.mktemp("seeds")]
    path = tmp_path_factory.mktemp("home")
    seed(path, SEEDED)
    yield path
    SEEDS.clear()
    SEEDS_DIR.clear()


@pytest.fixture(autouse=True)
def _evopool_home(home, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(home))


def run(ws: str | None = None, page: str | None = None, **params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if ws:
        at.query_params["ws"] = ws
    at.query_params.update(params)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Everything written as markdown, captions, alerts and expander labels, for substring checks."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [a.value for kind in (at.success, at.info, at.warning, at.error) for a in kind]
    parts += [e.label for e in at.expander]
    return "\n".join(parts)


def upload_into_new_workspace(home: Path, monkeypatch, name: str, file_name: str, lines: list[str]) -> AppTest:
    """A fresh studio home holding one empty workspace `name`, with `lines` uploaded as the CSV `file_name` (the
    import form is then drawn, nothing imported yet)."""
    monkeypatch.setenv("EVOPOOL_HOME", str(home))
    Store.open(home / name)
    at = run(name)
    at.file_uploader(key="upload").upload(file_name, "\n".join(lines).encode(), "text/csv")
    at.run()
    return at


def import_and_wait(at: AppTest, workdir: Path) -> None:
    """Press Import; the import is a background job: wait for it, then let the page poll once more."""
    at.button(key="do_import").click().run()
    job = REGISTRY.latest(workdir, "import")
    assert job is not None and job.wait(60)
    at.run()


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    """The first table on screen that has `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def button(at: AppTest, label: str):
    return next(b for b in at.form_submit_button if b.label == label)


def store_of(home: Path, name: str) -> Store:
    return Store.open(home / name)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


# ---- frame ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", ["pages/project.py", "pages/evolve.py", "pages/annotator.py",
                                  "pages/analytics.py", "pages/labels.py"])
def test_every_screen_says_evopool_studio_and_names_the_workspace(page, home):
    at = run(SEEDED, page)
    assert any("EvoPool Studio" in c.value and SEEDED in c.value for c in at.caption)
    assert at.title[0].value and not at.error
    assert at.sidebar.selectbox[0].value == SEEDED  # the frame's sidebar wraps every page
    task = Store.open(home / SEEDED).load_task().name  # the demo file's name: youtube_spam
    assert any(f"task **{task}**" in c.value.replace("\\_", "_") for c in at.caption)


def test_annotators_that_share_a_name_get_their_own_on_screen():
    from studio.queries import unique_names

    table = pd.DataFrame({"name": ["SPAM: links", "HAM: song", "SPAM: links", "SPAM: links"]})
    assert list(unique_names(table)["name"]) == ["SPAM: links", "HAM: song", "SPAM: links #2", "SPAM: links #3"]


def test_the_evolve_screen_says_when_generations_propose_nothing(tmp_path, monkeypatch):
    """The demo's offline agents run dry after two generations: past that the screen says more will not help, and
    what will."""
    at = run(SEEDED, "pages/evolve.py")
    assert "proposed nothing new" not in texts(at)  # two generations, both with candidates
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path))  # its own home: the shared one's workspace list stays as it is
    store = seed(tmp_path, "dry", generations=5)
    idle = review.idle_generations(store.generations())
    assert idle >= 2
    at = run("dry", "pages/evolve.py")
    shown = texts(at)
    assert f"The last {idle} generations proposed nothing new" in shown and "label more dev rows" in shown
    # the verdicts open on the newest generation with candidates, not on an empty one; the empty ones say so
    verdicts = store.verdicts()
    carded = sorted(set(verdicts.loc[verdicts["decided_by"] == "gate", "generation"].astype(int)))
    picker = at.selectbox(key="verdict_generation")
    assert picker.value == carded[-1] < 5
    assert "5 (no gate verdicts)" in picker.options and f"{carded[-1]}" in picker.options
    assert "No gate verdicts in this generation" not in texts(at)


def test_sidebar_picks_the_workspace_and_shows_its_facts(home):
    Store.open(home / "other")  # a second, empty workspace (an upload that failed): not offered to pick
    at = run(SEEDED, "pages/evolve.py")
    picker = at.sidebar.selectbox[0]
    assert picker.value == SEEDED and "other" not in picker.options
    facts = "\n".join(c.value for c in at.sidebar.caption)
    assert "2,056 rows" in facts and "generation 2" in facts and "annotators in the pool" in facts
    at = run("other", "pages/evolve.py")  # the open one is offered even when empty
    assert at.sidebar.selectbox[0].value == "other" and "other" in at.sidebar.selectbox[0].options
    assert "Open a workspace with data first" in texts(at)  # "other" is empty


# ---- project & data -----------------------------------------------------------------------------------
def test_project_screen_shows_the_workspace_rows_and_splits():
    at = run(SEEDED)
    assert at.title[0].value == "Project & data"
    assert metrics(at) == {"Rows": "2,056", "Unlabeled (pool)": "1,686", "Dev (labeled)": "120",
                           "Test (holdout)": "250"}
    rows = at.dataframe[0].value
    assert len(rows) == 25 and list(rows.columns) == ["id", "text", "label"]
    assert set(rows["label"]) <= {"HAM", "SPAM"}
    at.segmented_control(key="rows_split").set_value("test").run()
    assert set(at.dataframe[0].value["label"]) == {"(holdout: hidden)"}  # test labels are never shown


def test_describing_a_label_on_the_project_screen_saves_it_for_the_agents_and_undo_restores_it(home):
    store = Store.open(home / "describe-me")
    import_path(store, DEMO, IngestOptions())
    at = run("describe-me")

    def box():  # the description box of SPAM (a new key after each save or undo: a fresh box in the browser too)
        return next(t for t in at.text_area if t.key.startswith("describe_text_") and t.key.endswith("_SPAM"))

    assert not store.load_task().label_descriptions
    at.selectbox(key="describe_label").set_value("SPAM").run()
    at.button(key="describe_save").click().run()  # nothing typed yet: nothing saved, and it says so
    assert "Nothing to save" in texts(at) and not store.load_task().label_descriptions
    box().input("links, channel plugs, requests to subscribe")  # a form: the text goes with the click
    at.button(key="describe_save").click().run()
    assert not at.exception
    assert dict(store.load_task().label_descriptions) == {"SPAM": "links, channel plugs, requests to subscribe"}
    assert "Saved the description of SPAM" in texts(at)
    shown = table_with(at, "description")
    assert shown.to_dict("records") == [{"label": "SPAM", "description": "links, channel plugs, requests to subscribe",
                                         "given by": "expert (no name given)"}]
    assert box().value == "links, channel plugs, requests to subscribe"
    undo = at.button(key="describe_undo")
    assert "no description" in undo.label
    first_key = box().key
    undo.click().run()
    assert not store.load_task().label_descriptions
    assert not [b for b in at.button if b.key == "describe_undo"]  # one undo per save
    assert box().key != first_key and box().value == ""  # the box shows the description undone, not the draft
    box().input("plugs")
    at.button(key="describe_save").click().run()
    store.describe_label("SPAM", "changed elsewhere")  # e.g. by `evopool describe`: the undo no longer applies
    at.run()
    assert not [b for b in at.button if b.key == "describe_undo"]


def test_empty_home_offers_the_demo_and_one_click_loads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "fresh"))
    at = run()
    assert "No workspace yet" in "\n".join(c.value for c in at.sidebar.caption)
    at.button(key="load_demo").click().run()
    assert not at.exception
    assert at.query_params["ws"] == "youtube-spam-demo"
    assert "Imported 2,056 rows" in texts(at)
    assert metrics(at)["Rows"] == "2,056"
    assert Store.open(tmp_path / "fresh" / "youtube-spam-demo").count_examples() == 2056


def comments_with_a_typo() -> tuple[list[str], list[str]]:
    """40 labeled comment rows, and the CSV lines of them with row 4 labeled SPAMM (a typo of SPAM)."""
    rows = [f"r{i},comment number {i},{'SPAM' if i % 2 else 'HAM'}" for i in range(1, 41)]
    return rows, ["id,text,label", *rows[:3], "r4,great video,SPAMM", *rows[4:]]


def test_descriptions_and_an_order_typed_in_the_import_form_outlive_a_new_label_set(tmp_path, monkeypatch):
    """The descriptions table was keyed by the label set, so editing the label box (as its caption suggests, to make
    a typo a bad row) or uploading the fixed file wiped every description typed; the fixed file also reset the label
    order typed to the file's (a browser walk)."""
    rows, with_typo = comments_with_a_typo()
    at = upload_into_new_workspace(tmp_path / "desc", monkeypatch, "mine", "comments.csv", with_typo)
    assert at.text_input(key="map_labels").value == "HAM, SPAM, SPAMM"
    at.session_state["import_descriptions"] = {"SPAM": "promotes a channel", "HAM": "a real comment"}  # as typed
    at.text_input(key="map_labels").input("SPAM, HAM, SPAMM").run()  # the expert's order (the first class first)
    fixed = "\n".join(["id,text,label", *rows]) + "\n"
    at.text_input(key="map_task_name").input("Comment triage")
    at.text_area(key="map_instructions").input("SPAM promotes; HAM is a real comment.").run()
    for data in (fixed, "\n".join(with_typo) + "\n", fixed):  # fixed, broken again, fixed: what was typed stays
        at.file_uploader(key="upload").upload("comments.csv", data.encode(), "text/csv")
        at.run()
        assert at.text_input(key="map_task_name").value == "Comment triage"
        assert at.text_area(key="map_instructions").value == "SPAM promotes; HAM is a real comment."
    assert at.text_input(key="map_labels").value == "SPAM, HAM"  # the order typed, without the typo's label
    import_and_wait(at, tmp_path / "desc" / "mine")
    task = Store.open(tmp_path / "desc" / "mine").load_task()
    assert task.labels == ("SPAM", "HAM") and task.name == "Comment triage"
    assert task.instructions == "SPAM promotes; HAM is a real comment."
    assert dict(task.label_descriptions) == {"SPAM": "promotes a channel", "HAM": "a real comment"}


def test_the_import_report_is_not_shown_again_once_the_workspace_has_moved_on(tmp_path, monkeypatch):
    """A reload (a new session) showed the import's green report again, with the split counts of then above metrics
    that had moved since (rows labeled into dev): shown while the workspace holds what it says, not after."""
    rows = [f"r{i},comment number {i},{'SPAM' if i % 2 else 'HAM'}" for i in range(1, 41)]
    rows += [f"u{i},an unlabeled comment {i}," for i in range(10)]
    at = upload_into_new_workspace(tmp_path / "rep", monkeypatch, "mine", "c.csv", ["id,text,label", *rows])
    import_and_wait(at, tmp_path / "rep" / "mine")
    assert "Imported 50 rows" in texts(at)
    assert "Imported 50 rows" in texts(run("mine"))  # a reload at once: still what the workspace holds
    store = Store.open(tmp_path / "rep" / "mine")
    pool_row = store.example_ids("pool")[0]
    store.move_to_dev([(pool_row, 0, None)], by="expert")
    assert "Imported 50 rows" not in texts(run("mine"))


def test_an_order_typed_back_to_the_files_and_a_name_for_another_file_are_not_kept(tmp_path, monkeypatch):
    """Only edits differing from the default were kept: an order typed back to the file's came back as the one
    abandoned, and a task name typed for one file followed another file (a review)."""
    rows, with_typo = comments_with_a_typo()
    at = upload_into_new_workspace(tmp_path / "back", monkeypatch, "mine", "comments.csv", with_typo)
    at.text_input(key="map_labels").input("SPAM, HAM, SPAMM").run()
    at.text_input(key="map_labels").input("HAM, SPAM, SPAMM").run()  # back to the file's order
    at.text_input(key="map_task_name").input("Comment triage").run()
    fixed = "\n".join(["id,text,label", *rows]) + "\n"
    at.file_uploader(key="upload").upload("tweets.csv", fixed.encode(), "text/csv")
    at.run()
    assert at.text_input(key="map_labels").value == "HAM, SPAM"
    assert at.text_input(key="map_task_name").value == "tweets"  # another file: its own name


def test_import_errors_name_the_row_and_the_good_rows_can_be_imported(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "imp"))
    Store.open(tmp_path / "imp" / "mine")
    good = [f"r{i},comment number {i},{'SPAM' if i % 2 else 'HAM'}" for i in range(1, 41)]
    csv = "\n".join(["id,text,label", *good[:2], "r3,,HAM", "r4,great video,MAYBE", *good[4:]]) + "\n"
    at = run("mine")
    at.file_uploader(key="upload").upload("comments.csv", csv.encode(), "text/csv")
    at.run()
    assert len(at.dataframe[0].value) == 20  # the preview
    assert at.text_input(key="map_labels").value == "HAM, MAYBE, SPAM"  # as found in the file
    assert "Found in the file (rows each): HAM 20 · MAYBE 1 · SPAM 19." in texts(at)
    assert "Held by only one or two rows: MAYBE; a typo?" in texts(at)
    at.text_input(key="map_labels").input("HAM, SPAM").run()  # the curator declares the label set
    before = table_with(at, "problem")  # the bad rows are listed before Import is pressed, with their ids
    assert list(before["row"]) == [3, 4] and list(before["id"]) == ["r3", "r4"]
    assert "empty text" in before["problem"].iloc[0]
    import_and_wait(at, tmp_path / "imp" / "mine")
    problems = table_with(at, "problem")
    assert list(problems["row"]) == [3, 4] and list(problems["id"]) == ["r3", "r4"]
    assert sum("problem" in d.value.columns for d in at.dataframe) == 1  # listed once (the plan's, with ids)
    assert "empty text" in problems["problem"].iloc[0]
    assert "'MAYBE' is not in the label set" in problems["problem"].iloc[1]
    assert f"Nothing was imported: {escape_md('comments.csv: 2 problem(s)')}." in texts(at)  # file names are data
    assert texts(at).count("nothing was imported") == 0  # said once, not twice
    assert not Store.open(tmp_path / "imp" / "mine").has_data()

    at.checkbox(key="skip_bad_rows").check().run()
    # the failed import's error goes once the form differs from the one it failed with (it stood below a form that
    # had fixed it); the plan above says where the form stands
    assert "Nothing was imported" not in texts(at) and "will be skipped" in texts(at)
    import_and_wait(at, tmp_path / "imp" / "mine")
    assert not at.exception
    assert "Imported 38 rows" in texts(at) and "Skipped 2 bad row(s)" in texts(at)
    assert Store.open(tmp_path / "imp" / "mine").count_examples() == 38


def test_a_fixed_file_uploaded_again_under_its_name_does_not_show_the_old_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "imp"))
    Store.open(tmp_path / "imp" / "again")
    good = [f"r{i},comment number {i},{'SPAM' if i % 2 else 'HAM'}" for i in range(1, 41)]
    bad = "\n".join(["id,text,label", *good[:2], "r3,,HAM", *good[3:]]) + "\n"
    at = run("again")
    at.file_uploader(key="upload").upload("comments.csv", bad.encode(), "text/csv")
    at.run()
    import_and_wait(at, tmp_path / "imp" / "again")
    assert "Nothing was imported" in texts(at)
    fixed = "\n".join(["id,text,label", *good]) + "\n"
    at.file_uploader(key="upload").upload("comments.csv", fixed.encode(), "text/csv")
    at.run()
    assert "Nothing was imported" not in texts(at) and "bad row" not in texts(at)


def test_a_file_without_labels_is_told_as_the_files_problem_not_a_bad_row_to_skip(tmp_path, monkeypatch):
    """A file with no label column (or one label) cannot be imported however its rows are: the form once called that
    '1 bad row(s)', promised with the skip box ticked that it 'will be skipped', and after the failed import told
    the expert to tick that box again."""
    rows = [f"n{i},a free text note about the case number {i}" for i in range(50)]
    at = upload_into_new_workspace(tmp_path / "nolabel", monkeypatch, "notes", "notes.csv", ["id,text", *rows])
    assert any("at least two labels" in e.value for e in at.error), [e.value for e in at.error]
    assert not any("bad row" in w.value for w in at.warning), [w.value for w in at.warning]
    at.checkbox(key="skip_bad_rows").check().run()
    assert not any("will be skipped" in w.value for w in at.warning), [w.value for w in at.warning]
    import_and_wait(at, tmp_path / "nolabel" / "notes")
    assert not at.exception, [e.value for e in at.exception]
    assert "Nothing was imported" in texts(at) and "at least two labels" in texts(at)
    assert "tick **Import the good rows" not in texts(at)  # skipping rows cannot help
    assert not Store.open(tmp_path / "nolabel" / "notes").has_data()


def test_an_upload_with_no_readable_row_says_why_each_row_is_unreadable(tmp_path, monkeypatch):
    """A JSONL written with str(dict): the form said no column holds free text, and named no line."""
    lines = [str({"id": i, "text": f"comment number {i}", "label": "HAM"}) for i in range(10)]
    at = upload_into_new_workspace(tmp_path / "repr", monkeypatch, "mine", "comments.jsonl", lines)
    assert not at.exception, [e.value for e in at.exception]
    errors = " ".join(e.value for e in at.error)
    assert "none of the file's 10 rows could be read" in errors and "row 1: not valid JSON" in errors
    assert "no column holds free text" not in texts(at)


def test_a_ragged_upload_previews_its_good_rows_and_says_where_each_row_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "imp"))
    Store.open(tmp_path / "imp" / "legal")
    rows = [f"CL-{i},the parties agree to clause {i} of this contract,{'Payment' if i % 2 else 'Venue'}"
            for i in range(1, 61)]
    rows += [f"CL-U{i},an unlabeled clause about terms {i}," for i in range(1, 21)]
    rows[6] = "CL-7,a stray, comma,Payment"  # row 7 of the file's data: one cell too many
    csv = "\n".join(["clause_id,clause,label", *rows]) + "\n"
    at = run("legal")
    at.file_uploader(key="upload").upload("contracts.csv", csv.encode(), "text/csv")
    at.run()
    assert not at.exception
    assert at.selectbox(key="map_text").value == "clause"  # by content, not the id column
    assert at.text_input(key="map_task_name").value == "contracts"
    assert at.number_input(key="map_dev").value == 59  # the labeled rows, not 500
    bad = table_with(at, "problem")
    assert list(bad["row"]) == [7] and "4 cells where the header has 3" in bad["problem"].iloc[0]
    plan = " ".join(i.value for i in at.info)
    assert "dev **59**" in plan and "unlabeled pool **20**" in plan
    at.text_input(key="map_task_name").input("Contract clauses").run()
    at.checkbox(key="skip_bad_rows").check().run()
    import_and_wait(at, tmp_path / "imp" / "legal")
    assert not at.exception
    store = Store.open(tmp_path / "imp" / "legal")
    assert store.count_examples() == 79 and store.load_task().name == "Contract clauses"
    assert "Skipped 1 bad row(s)" in texts(at)


def test_another_file_brings_its_own_dev_size_to_the_plan(tmp_path, monkeypatch):
    """After several uploads the plan used the previous file's dev size (the box kept it) and the import wrote
    neither what the plan said nor what the file called for (a browser walk)."""
    def clauses(n: int) -> bytes:
        lines = [f"C{i},the parties agree to clause {i},{'Payment' if i % 2 else 'Venue'}" for i in range(n)]
        return ("\n".join(["id,text,label", *lines, *[f"U{i},an unlabeled clause {i}," for i in range(10)]])
                + "\n").encode()

    at = upload_into_new_workspace(tmp_path / "sizes", monkeypatch, "legal", "first.csv", [])
    at.file_uploader(key="upload").upload("first.csv", clauses(60), "text/csv")
    at.run()
    assert at.number_input(key="map_dev").value == 60
    at.number_input(key="map_dev").set_value(40).run()  # the expert's choice for this file
    plan = " ".join(i.value for i in at.info)
    assert "dev **40**" in plan
    at.file_uploader(key="upload").upload("second.csv", clauses(90), "text/csv")
    at.run()
    assert at.number_input(key="map_dev").value == 90  # the second file's own default, not 40
    assert "dev **90**" in " ".join(i.value for i in at.info)


@pytest.mark.shared_data
def test_a_wrench_folder_imports_from_a_path(tmp_path, monkeypatch, shared_data):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "wrench"))
    Store.open(tmp_path / "wrench" / "yt")
    at = run("yt")
    at.radio(key="import_source").set_value("A path on the server (file or WRENCH folder)").run()
    at.text_input(key="import_path").input(str(shared_data / "youtube")).run()
    assert not at.exception
    assert at.text_input(key="map_labels").value == "HAM, SPAM"  # from label.json, in its order
    import_and_wait(at, tmp_path / "wrench" / "yt")
    assert not at.exception
    assert "Imported" in texts(at)
    store = Store.open(tmp_path / "wrench" / "yt")
    assert store.load_task().labels == ("HAM", "SPAM")
    assert store.split_counts()["dev"] == 120


def test_create_workspace_refuses_a_bad_name(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "names"))
    at = run()
    at.text_input(key="new_ws").input("../escape").run()
    at.button(key="create_ws").click().run()
    assert "Workspace name" in texts(at)
    at.text_input(key="new_ws").input("trial-1").run()
    at.button(key="create_ws").click().run()
    assert at.query_params["ws"] == "trial-1" and (tmp_path / "names" / "trial-1" / "workspace.duckdb").exists()
    assert at.text_input(key="new_ws").value == ""  # the box is for the next one


# ---- evolve -------------------------------------------------------------------------------------------
def test_evolve_screen_shows_the_timeline_and_each_verdict_with_its_reasons(home):
    store = Store.open(home / SEEDED)
    at = run(SEEDED, "pages/evolve.py")
    assert metrics(at)["Complete generations"] == "2"
    assert len(at.get("plotly_chart")) == 1
    latest = store.verdicts(generation=2)  # the cross-fitted offline agents may send nothing by generation 2
    assert len(at.expander) == int((latest["decided_by"] == "gate").sum())
    at.selectbox(key="verdict_generation").set_value(1).run()
    gate = store.verdicts(generation=1)
    gate = gate[gate["decided_by"] == "gate"]
    assert len(at.expander) == len(gate) > 0
    shown = texts(at)
    plain = shown.replace("\\", "")  # markdown escapes "<" in "fires 3 < 5"
    for reasons in gate["reasons"]:
        assert reasons and reasons[0].split(":")[0] in plain
    assert "Gate reasons" in shown
    # every card says its verdict in plain words with the annotator's own fires and precision on the fitness rows
    assert shown.count("In plain words:") == len(gate)
    for annotator_id in gate["annotator_id"]:
        s = score.score_annotator(annotator_id, store.vote_matrix([annotator_id], FITNESS).votes[:, 0],
                                  store.gold(FITNESS))
        if s.fires:
            assert f"right on {s.correct} of them (precision {s.precision:.2f})" in shown


def test_rejecting_against_the_gate_needs_a_reason_and_is_logged(home):
    store = seed(home, "reject-me", generations=1)
    cards = store.verdicts(generation=1)
    card = int((cards["verdict"] == "accept").to_numpy().argmax())  # one card (and one form) per verdict
    accepted = cards["annotator_id"].iloc[card]
    at = run("reject-me", "pages/evolve.py")
    assert at.form_submit_button[card].label.startswith("Reject")
    at.form_submit_button[card].click().run()  # no reason yet
    assert "Give a reason" in texts(at)
    assert accepted in store.pool_ids()
    at.text_input(key=f"note_card_{accepted}").input("fires on song titles, not spam")
    at.form_submit_button[card].click().run()
    assert not at.exception
    assert accepted not in store.pool_ids()
    latest = store.verdicts(annotator_id=accepted).iloc[-1]
    assert (latest["verdict"], latest["decided_by"], latest["note"]) == ("reject", "human",
                                                                         "fires on song titles, not spam")
    assert "logged with your reason" in texts(at)
    assert at.text_input(key=f"note_card_{accepted}").value == ""  # the Approve it now offers starts without a reason
    # its card stays open (the undo is in it), under the verdict that stands; the others stay folded
    from studio.queries import escape_md

    name = escape_md(store.annotator(accepted).name)  # as the title writes it
    card_now = next(e for e in at.expander if name in e.label)
    assert card_now.label.startswith(":red[:material/block:] expert: reject") and "the gate: accept" in card_now.label
    assert card_now.proto.expanded
    assert not any(e.proto.expanded for e in at.expander if e.label.startswith(":green"))
    assert any(b.label == "Undo my reject" for b in at.button)


def test_a_verdict_on_the_annotator_screen_keeps_the_annotator_on_screen(home):
    """Opened with no annotator chosen, the screen shows the pool's first; rejecting it reorders the list, and the
    screen stays on it (it showed the next member, ready to be rejected with the same reason)."""
    seed(home, "verdict-here", generations=1)
    at = run("verdict-here", "pages/annotator.py")
    shown = at.selectbox(key="pick_annotator").value
    at.text_input(key=f"note_annotator_{shown}").input("fires on song titles")
    next(b for b in at.get("form_submit_button") if b.label.startswith("Reject")).click().run()
    assert not at.exception and at.selectbox(key="pick_annotator").value == shown
    assert metrics(at)["Verdict"] == "reject" and at.query_params["annotator"] in (shown, [shown])
    assert at.text_input(key=f"note_annotator_{shown}").value == ""
    assert any(b.label.startswith("Approve") for b in at.get("form_submit_button"))


def test_run_button_starts_a_background_generation(home):
    seed(home, "run-me", generations=1)
    at = run("run-me", "pages/evolve.py")
    assert at.selectbox(key="verdict_generation").value == 1
    at.button(key="evolve_start").click().run()
    job = REGISTRY.latest(home / "run-me", "evolve")
    assert job is not None and job.wait(120) and job.status == "done", job and job.error
    at.run()
    shown = metrics(at)
    assert shown["Complete generations"] == "2"
    assert at.selectbox(key="verdict_generation").value == 2  # the verdicts shown are the new generation's
    assert "Last run finished" in texts(at)
    verdicts = Store.open(home / "run-me").verdicts(generation=2)
    gate = verdicts[verdicts["decided_by"] == "gate"]
    assert shown["Candidates (this run)"] == str(len(gate))  # the same figure the verdict cards count
    assert shown["Accepted (this run)"] == str(int((gate["verdict"] == "accept").sum()))
    assert "None" not in texts(at)
    assert "Since then" not in texts(at)
    # a verdict given after the run moves the pool the metric and the chart show: the run's line says both
    store = Store.open(home / "run-me")
    review.reject(store, store.pool_ids()[0], "too broad")
    at.run()
    pool_now = len(store.pool_ids())
    assert metrics(at)["Pool size"] == str(pool_now)
    assert f"make it pool {pool_now}, dev macro-F1 {current_dev_macro_f1(store):.3f}" in texts(at)


# ---- annotator ----------------------------------------------------------------------------------------
def test_annotator_screen_shows_scores_code_lineage_and_where_it_fires(home):
    store = Store.open(home / SEEDED)
    target = store.pool_ids()[0]
    score = store.scores([target])[target]
    at = run(SEEDED, "pages/annotator.py", annotator=target)
    shown = metrics(at)
    assert shown["Precision (dev)"] == f"{score.precision:.2f}"
    assert shown["Fires"] == str(score.fires)
    assert shown["Verdict"] in ("accept", "approve")
    assert f"Fires on {score.fires} dev rows" in texts(at)
    decided = int(store.verdicts(target)["generation"].iloc[-1])
    assert decided < store.last_complete_generation()  # accepted in generation 1 of 2: against an older pool
    assert (f"In plain words (the gate's reasons as it decided in generation {decided}, against the pool of then; "
            "*Contribution* above is with the pool as it is now):** It votes (mostly) **") in texts(at)
    assert "Accepted" in texts(at)
    history = table_with(at, "reason")
    assert history["by"].tolist()[0] == "gate" and history["verdict"].tolist()[0] == "accept"
    assert "viable" in history["reason"].iloc[0]  # the gate's reasons, as recorded
    at.toggle(key="plain_editor").set_value(True).run()  # (AppTest cannot see inside the Ace component)
    assert at.text_area(key=f"plain_{target}").value == store.annotator(target).source


def test_a_stale_pick_in_the_workspace_picker_does_not_switch_workspaces(home):
    """A picker keyed per workspace kept a stale pick when a rerun was cut short (a job's refresh every 1.5 s): open
    A, its old picker still said B, so the studio switched to B, whose old picker said A, and so on without end (a
    browser walk). One picker, set to the open workspace before it is drawn, cannot hold another's pick."""
    for name in ("pick-a", "pick-b"):
        seed(home, name, generations=0)
    at = run("pick-a")
    at.selectbox(key="ws_picker").set_value("pick-b").run()
    assert at.session_state["workspace"] == "pick-b" and at.query_params["ws"] in ("pick-b", ["pick-b"])
    at.selectbox(key="ws_picker").set_value("pick-a").run()
    assert at.session_state["workspace"] == "pick-a"
    at.session_state["ws_picker_pick-a"] = "pick-b"  # what a cut-short rerun left behind (either way of keying)
    at.session_state["ws_picker"] = "pick-b"
    for _ in range(3):
        at.run()
        assert not at.exception
        assert at.session_state["workspace"] == "pick-a" and at.selectbox(key="ws_picker").value == "pick-a"


def test_names_from_a_model_are_shown_as_text_not_as_links_or_images(home):
    """An LLM names its annotator with its docstring's first line: `![x](https://…) [sign in](https://…)` was
    rendered as a remote image and a link on other annotators' verdict cards ("too similar to …", "with …") and in
    the flash after a verdict (a red-team review)."""
    store = seed(home, "hostile-names", generations=2)
    for number, member in enumerate(store.annotators()):
        store._q("UPDATE annotators SET name = ? WHERE id = ?",
                 [f"![x{number}](https://attacker.example/p.png) [sign in](https://attacker.example/login)", member.id])
    target = store.pool_ids()[0]
    shown = texts(run("hostile-names", "pages/evolve.py")) + texts(run("hostile-names", "pages/annotator.py",
                                                                       annotator=target))
    named = [line for line in shown.splitlines() if "attacker" in line]
    assert named, "no verdict of this pool names another annotator: the check saw nothing"
    assert not any(re.search(r"(?<!\\)\]\(https", line) or "![" in line for line in named), named
    at = run("hostile-names", "pages/annotator.py", annotator=target)
    next(b for b in at.get("form_submit_button") if b.label.startswith("Reject")).click()
    at.text_input(key=f"note_annotator_{target}").input("not a rule")
    next(b for b in at.get("form_submit_button") if b.label.startswith("Reject")).click().run()
    flashed = [a.value for a in at.success if "Rejected" in a.value]
    assert flashed and "](https" not in flashed[0].replace("\\]\\(https", ""), flashed


def test_a_verdict_of_the_latest_generation_is_not_dated_against_an_older_pool(home):
    """The caveat that the gate's reasons are of an older pool showed on every gate verdict, even one of the last
    generation with no verdict since: it shows only once a later verdict has moved the pool."""
    store = seed(home, "latest", generations=1)
    target = store.pool_ids()[0]
    at = run("latest", "pages/annotator.py", annotator=target)
    assert not at.exception
    assert "**In plain words:** It votes" in texts(at) and "against the pool of then" not in texts(at)
    other = next(i for i in store.pool_ids() if i != target)
    review.reject(store, other, "too broad")  # a verdict after the gate's: the pool moved
    at = run("latest", "pages/annotator.py", annotator=target)
    assert "the gate's reasons as it decided in generation 1, against the pool of then" in texts(at)
    # a gate verdict given outside a generation (a pool add's prune, dated to generation 1) is no verdict of that
    # generation's gate: the pool has still moved since (a review)
    from engine.domain import GateDecision

    before = store.last_gate_verdict(1)
    with store.transaction():
        store.record_gate_decisions([GateDecision(other, "prune", ("covered by x: 0.9",), "gate", "pool add")])
    assert store.last_gate_verdict(1) == before
    at = run("latest", "pages/annotator.py", annotator=target)
    assert "the gate's reasons as it decided in generation 1, against the pool of then" in texts(at)


def test_the_new_annotator_skeleton_parses_whatever_quotes_a_label_holds():
    import ast

    from engine.domain import Task
    from studio.new_annotator_ui import starter

    for label in ('say "hi"', "it's", "back\\slash"):
        tree = ast.parse(starter(Task("t", (label, "other"), {}, "")))
        assert any(isinstance(n, ast.Constant) and n.value == label for n in ast.walk(tree))


def test_a_new_annotator_written_in_the_studio_is_weighed_by_the_gate_and_can_be_added_over_it(home):
    """The Evolve screen advised writing an annotator yourself, but the studio could only edit existing ones (and
    saving an edit retires its parent): a browser walk. The form runs a new one on dev and asks the gate."""
    store = seed(home, "new-ann", generations=1)
    before = set(store.pool_ids())
    at = run("new-ann", "pages/annotator.py")
    assert "def annotate(example):" in at.text_area(key="new_source").value  # a skeleton to fill in
    at.text_area(key="new_source").input("import os\n\ndef annotate(example):\n    return None\n")
    next(b for b in at.get("form_submit_button") if b.label == "Ask the gate").click().run()
    assert not at.exception and any("Not run" in e.value and "os" in e.value for e in at.error)
    assert set(store.pool_ids()) == before  # nothing saved
    # a rule no better than chance: the gate turns it away, and the expert adds it over the gate with a reason
    chance = "def annotate(example):\n    return 'HAM' if len(example['text']) % 2 else None\n"
    at.text_area(key="new_source").input(chance)
    at.text_input(key="new_name").input("HAM: odd lengths")
    next(b for b in at.get("form_submit_button") if b.label == "Ask the gate").click().run()
    assert any("The gate rejected it" in w.value for w in at.warning), [w.value for w in at.warning]
    rejected = next(w.value for w in at.warning if "The gate rejected it" in w.value)
    assert "Rejected:" in rejected and "viable:" not in rejected  # the failing check in words, not every check
    # its panel stays open on the answer (it closed and hid the verdict while an annotator was open)
    assert next(e for e in at.expander if e.label == "Write a new annotator").proto.expanded
    assert set(store.pool_ids()) == before
    # the answer is this workspace's: in another one it is gone (its "Add it over the gate" would add this code there)
    other = run(SEEDED, "pages/annotator.py")
    other.session_state["new_annotator_result"] = at.session_state["new_annotator_result"]
    other.selectbox(key="ws_picker").set_value("new-ann").run()
    other.selectbox(key="ws_picker").set_value(SEEDED).run()
    assert not any("The gate rejected it" in w.value for w in other.warning)
    at.text_input(key="new_override").input("a hunch worth a generation")
    next(b for b in at.get("form_submit_button") if b.label == "Add it over the gate").click().run()
    assert not at.exception
    (added,) = set(store.pool_ids()) - before
    assert store.annotator(added).name == "HAM: odd lengths" and store.annotator(added).author == "human"
    assert "a hunch worth a generation" in store.verdicts(added)["note"].iloc[-1]
    assert at.query_params["annotator"] in (added, [added])  # it opens on the new one
    # code that only faults takes a second yes before it joins (as saving such an edit does)
    spin = "def annotate(example):\n    return example['no such field']\n"
    at.text_area(key="new_source").input(spin)
    next(b for b in at.get("form_submit_button") if b.label == "Ask the gate").click().run()
    at.text_input(key="new_override").input("trust me")
    next(b for b in at.get("form_submit_button") if b.label == "Add it over the gate").click().run()
    assert any("faults and never votes" in e.value for e in at.error)
    assert len(store.pool_ids()) == len(before) + 1  # not added
    at.checkbox(key=next(c.key for c in at.checkbox if c.key.startswith("new_broken_"))).check()
    next(b for b in at.get("form_submit_button") if b.label == "Add it over the gate").click().run()
    assert len(store.pool_ids()) == len(before) + 2


def test_editing_rescoring_and_saving_a_new_version(home):
    store = seed(home, "edit-me", generations=1)
    target = store.pool_ids()[0]
    original = store.annotator(target)
    at = run("edit-me", "pages/annotator.py", annotator=target)
    at.toggle(key="plain_editor").set_value(True).run()
    broken = at.text_area(key=f"plain_{target}")
    broken.input(original.source + "\nimport os\n").run()
    at.button(key="rescore").click().run()
    assert "refused" in texts(at) and "os" in texts(at)

    at.text_area(key=f"plain_{target}").input(original.source + "\nREVIEWED_BY = 'expert'\n").run()
    at.button(key="rescore").click().run()
    assert not at.exception
    compare = at.dataframe[0].value
    assert list(compare.columns) == ["measure", "saved version", "your edit"]
    assert compare.set_index("measure").loc["fires", "your edit"] == store.scores([target])[target].fires
    at.text_input(key="edit_note").input("tagged as reviewed")
    assert at.text_input(key="edit_name").value == original.name  # its cues are the parent's: the parent's name
    at.text_input(key="edit_name").input("SPAM: reviewed by the expert")
    button(at, "Save as a new version").click().run()
    assert not at.exception
    assert "Saved as a new version" in texts(at)
    children = store.children_of(target)
    assert len(children) == 1 and children[0].author == "human"
    assert children[0].name.startswith("SPAM: reviewed by the expert")
    assert children[0].id in store.pool_ids() and target not in store.pool_ids()
    assert at.query_params["annotator"] == children[0].id
    family = table_with(at, "relation")
    assert family["relation"].tolist() == ["parent"] and family["name"].tolist() == [original.name]
    parent = run("edit-me", "pages/annotator.py", annotator=target)  # retired for the edit, not rejected
    assert metrics(parent)["Verdict"] == "replaced" and "Retired when its edited version" in texts(parent)
    assert " · replaced · " in parent.selectbox(key="pick_annotator").format_func(target)  # the picker says so too
    history = table_with(at, "reason")
    assert history["reason"].tolist()[-1] == "tagged as reviewed"
    assert history["by"].tolist()[-1] == "expert (no name given)"  # the session gave no name

    # the old version's "Restore this version" swaps them back: the parent in, the edit out (both voted before)
    at = run("edit-me", "pages/annotator.py", annotator=target)
    restore = next(b for b in at.button if b.label == "Restore this version")
    restore.click().run()
    assert not at.exception
    assert target in store.pool_ids() and children[0].id not in store.pool_ids()
    assert f"{children[0].id[:8]} left the pool in its place" in texts(at)
    # its reasons are the gate's of generation 1, against the pool of then: the screen says so
    assert "the gate's reasons as it decided in generation 1" in texts(at)



def test_an_edit_and_its_rescore_survive_a_visit_to_another_screen_and_can_be_discarded(home):
    """Streamlit forgets the state of widgets a run does not draw: an expert who re-scored an edit, looked at the
    Evolve screen and came back found the saved code, with no word of the edit (a walk in a real browser)."""
    store = seed(home, "edit-away", generations=1)
    target = store.pool_ids()[0]
    original = store.annotator(target)
    edited = original.source + "\nREVIEWED_BY = 'expert'\n"
    at = run("edit-away", "pages/annotator.py", annotator=target)
    at.toggle(key="plain_editor").set_value(True).run()
    at.button(key="rescore").click().run()  # never disabled (a disabled one took two clicks): it says why not
    assert "Nothing to re-score" in texts(at)
    at.text_area(key=f"plain_{target}").input(edited).run()
    at.button(key="rescore").click().run()
    assert "Saved version vs your edit" in texts(at)
    at.switch_page("pages/evolve.py").run()
    at.switch_page("pages/annotator.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.toggle(key="plain_editor").value  # the plain editor stays on
    assert at.text_area(key=f"plain_{target}").value == edited
    assert "Saved version vs your edit" in texts(at)  # its re-score too
    at.button(key=f"discard_{target}").click().run()
    assert not at.exception
    assert next(t for t in at.text_area if t.key.startswith(f"plain_{target}")).value == original.source
    assert "Saved version vs your edit" not in texts(at)


def test_an_unsaved_edit_survives_a_reload_and_discarding_it_forgets_it_there_too(home):
    """Drafts lived in the browser session: a reload (a new session) silently dropped an edit that had been re-scored
    (a browser walk). The workspace keeps it until it is saved or discarded."""
    store = seed(home, "edit-reload", generations=1)
    target = store.pool_ids()[0]
    original = store.annotator(target)
    edited = original.source + "\nREVIEWED_BY = 'expert'\n"
    at = run("edit-reload", "pages/annotator.py", annotator=target)
    at.toggle(key="plain_editor").set_value(True).run()
    at.text_area(key=f"plain_{target}").input(edited).run()
    again = run("edit-reload", "pages/annotator.py", annotator=target)  # a reload: a new session
    assert "An unsaved edit of this annotator" in texts(again)
    again.toggle(key="plain_editor").set_value(True).run()
    assert next(t for t in again.text_area if t.key.startswith(f"plain_{target}")).value == edited
    again.button(key=f"discard_{target}").click().run()
    assert store.draft(target) is None
    fresh = run("edit-reload", "pages/annotator.py", annotator=target)
    assert "An unsaved edit" not in texts(fresh)


def test_the_aggregator_and_the_generation_chosen_survive_a_visit_to_another_screen(home):
    """Streamlit forgets a widget a run does not draw: back from another screen, the Labels screen showed (and would
    download) auto's labels instead of the aggregator chosen, and Evolve an empty generation (a browser walk)."""
    at = run(SEEDED, "pages/labels.py")
    at.selectbox(key="aggregator").set_value("mv").run()
    at.switch_page("pages/evolve.py").run()
    assert at.selectbox(key="verdict_generation").value == 2
    at.selectbox(key="verdict_generation").set_value(1).run()
    at.switch_page("pages/analytics.py").run()
    at.switch_page("pages/evolve.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="verdict_generation").value == 1
    at.switch_page("pages/labels.py").run()
    assert at.selectbox(key="aggregator").value == "mv"


def test_an_edited_version_is_named_after_the_cues_it_now_checks():
    from engine.domain import Annotator
    from engine.specs.templates import AnnotatorSpec, render
    from studio.annotator_ui import edit_name

    spec = AnnotatorSpec("cue", "SPAM", "sentence", ("check*", "subscribe*", "up", "of"))
    parent = Annotator(id="p", name="SPAM: check*, subscribe*, up… [sentence]", source=render(spec), agent="generator",
                       generation=1)
    narrower = render(AnnotatorSpec("cue", "SPAM", "sentence", ("check*", "subscribe*")))
    assert edit_name(narrower, parent) == "SPAM: check*, subscribe* [sentence]"
    assert edit_name(parent.source + "\nREVIEWED_BY = 'expert'\n", parent) == parent.name  # the same cues
    assert edit_name("def annotate(example):\n    return None\n", parent) == parent.name  # free-form code
    # free-form code whose docstring now names another label is called by it, not by the parent's label
    relabeled = 'def annotate(example):\n    """ABBR: asks what an abbreviation stands for"""\n    return None\n'
    assert edit_name(relabeled, parent) == "ABBR: asks what an abbreviation stands for"


def test_an_edit_that_only_faults_takes_a_second_yes_to_replace_a_working_version(home):
    """Code that raises on every dev row passed the checks and, saved, retired the working version it came from
    and labeled nothing; saving it now needs a tick."""
    store = seed(home, "edit-broken", generations=1)
    target = store.pool_ids()[0]
    at = run("edit-broken", "pages/annotator.py", annotator=target)
    at.toggle(key="plain_editor").set_value(True).run()
    at.text_area(key=f"plain_{target}").input("def annotate(example):\n    return example['no such field']\n").run()
    at.button(key="rescore").click().run()
    assert not at.exception and "It ran, with faults" in texts(at)
    button(at, "Save as a new version").click().run()
    assert "Not saved: the edit faults and never votes" in texts(at)
    assert {"In the pool?", "Lineage", "Where your edit fires on dev"} <= {h.value for h in at.subheader}  # all draws
    assert store.children_of(target) == [] and target in store.pool_ids()  # nothing replaced
    at.checkbox(key="edit_broken").check()  # a form's widgets are sent with its button
    button(at, "Save as a new version").click().run()
    assert "Saved as a new version" in texts(at) and len(store.children_of(target)) == 1


# ---- analytics ----------------------------------------------------------------------------------------
def test_analytics_screen_shows_the_pool_in_numbers_and_plots(home):
    store = Store.open(home / SEEDED)
    at = run(SEEDED, "pages/analytics.py")
    shown = metrics(at)
    assert shown["Annotators in the pool"] == str(len(store.pool_ids()))
    assert shown["Rows (dev)"] == "120"
    assert len(at.get("plotly_chart")) == 7  # coverage, timeline, overlap, conflict, scatter, contributions, weak
    disputed = table_with(at, "disagreement (bits)")
    assert {"text", "disagreement (bits)", "votes HAM", "votes SPAM", "gold"} <= set(disputed.columns)
    assert (disputed["disagreement (bits)"] > 0).all()
    assert (disputed["votes HAM"] > 0).all() and (disputed["votes SPAM"] > 0).all()


def test_weak_spots_group_the_rows_and_aim_the_next_generation(home):
    store = Store.open(home / SEEDED)
    at = run(SEEDED, "pages/analytics.py")
    groups = [e for e in at.expander if " rows · " in e.label and "no vote" in e.label]
    assert 1 <= len(groups) <= 5
    aim = next(b for b in at.button if b.key and b.key.startswith("focus_") and b.key != "focus_clear")
    aim.click().run()
    focus = store.get_meta("focus")
    assert focus and focus["terms"] and len(focus["example_ids"]) >= 1
    assert set(focus["example_ids"]) <= set(store.example_ids(focus["split"]))
    assert "aimed at" in texts(at)
    at.button(key="focus_clear").click().run()
    assert not store.get_meta("focus")


def test_audit_figure_and_fitness_figure_are_compared_on_the_classes_the_audit_rows_hold(home, tmp_path):
    """A class with under 10 dev rows gets no audit rows; the analytics screen compares the pool's audit and fitness
    figures on the other classes and says which class the audit rows cannot judge."""
    frame = pd.read_csv(DEMO)
    dev_ham = frame.index[(frame["split"] == "dev") & (frame["label"] == "HAM")][:6]
    frame.loc[dev_ham, "label"] = "MUSIC"  # a third class with 6 dev rows
    path = tmp_path / "three.csv"
    frame.to_csv(path, index=False)
    store = Store.open(home / "three")
    import_path(store, path, IngestOptions(audit_fraction=0.5))
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
    labels = store.load_task().labels
    music = labels.index("MUSIC")
    assert music not in set(store.label_indices(AUDIT)) and music in set(store.label_indices(FITNESS))
    audit_votes, fitness_votes = (store.vote_matrix(store.pool_ids(), s).votes for s in (AUDIT, FITNESS))
    audit, fitness, judged = score.audit_and_fitness_f1(audit_votes, store.label_indices(AUDIT), fitness_votes,
                                                        store.label_indices(FITNESS), len(labels))
    assert not judged[music]
    at = run("three", "pages/analytics.py")
    metric = next(m for m in at.metric if m.label == "Pool audit macro-F1")
    assert metric.value == f"{audit:.3f}" and metric.delta == f"{audit - fitness:+.3f} vs fitness on 2 of 3 classes"
    assert "none of MUSIC" in metric.proto.help and f"{fitness:.3f} on the fitness rows" in metric.proto.help
    # the timeline beside it draws the same comparison, generation by generation
    lines = {t.get("name"): t for c in charts(at) if "Generations" in c["layout"]["title"]["text"] for t in c["data"]}
    assert lines["fitness macro-F1 (classes with audit rows)"]["y"] == pytest.approx([fitness])
    assert lines["audit macro-F1"]["y"] == pytest.approx([audit])


def test_a_finished_run_is_not_said_to_have_changed_when_nothing_did(home, tmp_path):
    """With a class the audit rows lack, the chart's fitness figure keeps to the other classes: the Evolve screen's
    line compared the run's figure with it and said verdicts and dev labels had moved it (0.608 -> 0.585) straight
    after a run in which nothing was given (a browser walk)."""
    frame = pd.read_csv(DEMO)
    dev_ham = frame.index[(frame["split"] == "dev") & (frame["label"] == "HAM")][:6]
    frame.loc[dev_ham, "label"] = "MUSIC"  # a third class with 6 dev rows: none among the audit rows
    path = tmp_path / "three.csv"
    frame.to_csv(path, index=False)
    store = Store.open(home / "three-run")
    import_path(store, path, IngestOptions(audit_fraction=0.5))
    at = run("three-run", "pages/evolve.py")
    at.button(key="evolve_start").click().run()
    job = REGISTRY.latest(home / "three-run", "evolve")
    assert job is not None and job.wait(120) and job.status == "done", job and job.error
    at.run()
    # the chart's fitness figure, over the classes the audit rows hold, differs here from the run's
    _, fitness, judged = score.audit_and_fitness_f1(
        store.vote_matrix(store.pool_ids(1), AUDIT).votes, store.gold(AUDIT),
        store.vote_matrix(store.pool_ids(1), FITNESS).votes, store.gold(FITNESS), len(store.load_task().labels))
    assert not judged.all() and fitness != pytest.approx(current_dev_macro_f1(store))
    assert "Last run finished" in texts(at) and "Since then" not in texts(at)


def test_audit_rows_show_the_honest_figure_beside_the_selected_one(home):
    store = seed(home, "audited", generations=2, options=IngestOptions(audit_fraction=0.5))
    assert metrics(run("audited"))["Dev (labeled)"] == "120 (60 audit)"
    # the timeline draws the pool of each generation on the audit rows beside its fitness figure
    spec = charts(run("audited", "pages/evolve.py"))[0]
    lines = {trace.get("name"): trace for trace in spec["data"]}
    assert {"pool size", "fitness macro-F1", "audit macro-F1"} <= set(lines)
    expected = [score.pool_macro_f1(store.vote_matrix(store.pool_ids(g), AUDIT).votes, store.label_indices(AUDIT), 2)
                for g in (1, 2)]
    assert lines["audit macro-F1"]["x"] == [1, 2] and lines["audit macro-F1"]["y"] == pytest.approx(expected)
    assert store.pool_ids(2) == store.pool_ids() and store.pool_ids(0) == []
    at = run("audited", "pages/analytics.py")
    audit_metric = next(m for m in at.metric if m.label == "Pool audit macro-F1")
    fitness = score.pool_macro_f1(store.vote_matrix(store.pool_ids(), FITNESS).votes, store.label_indices(FITNESS), 2)
    audit = score.pool_macro_f1(store.vote_matrix(store.pool_ids(), AUDIT).votes, store.label_indices(AUDIT), 2)
    assert audit_metric.value == f"{audit:.3f}" and audit_metric.delta == f"{audit - fitness:+.3f} vs fitness"
    honest = pool_audit_estimate(store)  # the same figure, with its interval, in words
    assert honest.macro_f1 == pytest.approx(audit, abs=1e-4) and honest.low <= audit <= honest.high
    assert f"its majority vote scores {honest.macro_f1:.3f} (90% interval {honest.low:.2f}" in texts(at)
    # contributions are measured where the gate measures them: on the fitness rows
    bars = next(c for c in charts(at) if "What each annotator adds" in c["layout"]["title"]["text"])["data"][0]
    fitness_votes = store.vote_matrix(store.pool_ids(), FITNESS).votes
    expected = score.marginal_contributions(fitness_votes, store.label_indices(FITNESS), 2)
    shown = values(bars["x"])
    assert sorted(shown) == pytest.approx(sorted(expected))
    job = start_labels(home / "audited", "auto", compare=False)
    assert job.wait(300) and job.status == "done", job.error
    saved = load_labels(home / "audited", "auto")
    assert saved.dev_scores.choice.chosen_on == "audit" and saved.dev_scores.n_audit == 60
    assert saved.resolved == f"auto:{saved.dev_scores.choice.chosen}"  # the export names what made the labels
    at = run("audited", "pages/labels.py")
    estimate = saved.dev_scores.estimate
    assert metrics(at)["Expected macro-F1"] == f"{estimate.macro_f1:.2f}"
    assert metrics(at)["Aggregator"] == "auto" and f"Auto chose {saved.dev_scores.choice.chosen}" in texts(at)
    if saved.dev_scores.uses_pool:  # what uses the pool is estimated on the audit rows alone
        assert estimate.judged_on == "audit" and estimate.n_rows <= 60
        assert "audit rows (held back from the agents and the gate)" in texts(at)
    # a student is explained as one: what it learns from and what it reads when it labels
    said_student = "A student learns from its teacher's labels" in texts(at)
    assert said_student == ("student<" in saved.dev_scores.choice.chosen)
    # the manifest download carries the same provenance as `evopool export`'s
    frame = export.labeled_frame(store, SoftLabels(saved.probs, saved.example_ids, saved.resolved), saved.hard,
                                 saved.n_votes)
    assert set(frame["aggregator"]) == {saved.resolved}
    manifest = json.loads(labels_ui.manifest_json(store, saved, frame))
    assert manifest["aggregator"] == saved.resolved and manifest["rows"] == 2056
    assert manifest["dev_scores"]["chosen_on"] == "audit" and manifest["dev_scores"]["n_audit"] == 60
    assert [a["id"] for a in manifest["pool"]] == store.pool_ids()


# ---- labels & export ----------------------------------------------------------------------------------
def test_labels_screen_before_and_after_computing(home):
    seed(home, "label-me", generations=1)
    at = run("label-me", "pages/labels.py")
    assert "No soft labels for this aggregator yet" in texts(at)
    job = start_labels(home / "label-me", "mv", compare=False)
    assert job.wait(180) and job.status == "done", job.error
    at.selectbox(key="aggregator").set_value("mv").run()
    assert not at.exception
    saved = load_labels(home / "label-me", "mv")
    shown = metrics(at)
    assert shown["Rows labeled"] == f"{int((saved.hard >= 0).sum()):,} / 2,056"
    assert shown["Aggregator"] == "mv"
    assert len(at.get("plotly_chart")) == 3
    table = table_with(at, "n_votes")
    assert len(table) == 25
    assert {"id", "text", "split", "label", "confidence", "p_HAM", "p_SPAM", "n_votes", "aggregator"} <= set(
        table.columns)
    buttons = {b.proto.label: b.proto for b in at.get("download_button")}
    assert len(buttons) == 6 and not buttons["Hugging Face dataset (.zip)"].disabled
    assert "start with an apostrophe" not in texts(at)
    at.toggle(key="csv_spreadsheet_safe").set_value(True).run()  # the demo's comments: some start with - or +
    quoted = re.search(r"([\d,]+) cells will start with an apostrophe in the CSV", texts(at))
    assert not at.exception and quoted and int(quoted.group(1).replace(",", "")) > 0
    at.toggle(key="csv_spreadsheet_safe").set_value(False).run()
    at.multiselect(key="browse_class").set_value(["SPAM"]).run()
    assert set(table_with(at, "n_votes")["label"]) == {"SPAM"}
    assert isinstance(table_with(at, "n_votes"), pd.DataFrame)
    # the regression list: exactly the dev rows whose saved (out-of-fold) label is not the gold one
    from engine.expert.rows import regression_rows
    wrong = regression_rows(store_of(home, "label-me"), saved.example_ids, saved.probs, saved.hard)
    assert f"{len(wrong)} of {store_of(home, 'label-me').count_examples(FITNESS)} dev rows" in texts(at)
    shown_wrong = next(d.value for d in at.dataframe if "predicted" in d.value.columns)
    assert list(shown_wrong["id"]) == list(wrong["id"])
    # rows like one of them get one label each (a single-label task: no label sets)
    like = label_like_rows(at, wrong["id"][0], {0: "SPAM", 1: "HAM"}, "your label")
    moved = store_of(home, "label-me").examples_frame("dev", ids=list(like["id"][:3]))
    assert dict(zip(moved["id"], moved["label"], strict=True)) == {like["id"][0]: 1, like["id"][1]: 0}
    assert moved["label_set"].isna().all()
    assert set(table_with(at, "by")["label"]) == {"SPAM", "HAM"}
    with pytest.MonkeyPatch.context() as patch:  # without `datasets` the option is off and says how to get it
        patch.setitem(sys.modules, "datasets", None)
        at.run()
        buttons = {b.proto.label: b.proto for b in at.get("download_button")}
        assert buttons["Hugging Face dataset (.zip)"].disabled
        assert "Hugging Face dataset: off" in texts(at) and "pip install" in texts(at)


def test_rows_of_a_chosen_class_are_labeled_into_dev_with_or_without_soft_labels(home):
    """The Labels screen's *Label rows for dev* (where the thin-class advice sends the expert): the classes listed
    thinnest first, the unlabeled rows likely of the one picked, and the rows labeled there join dev with a note."""
    from engine.expert.rows import rows_of_class

    store = seed(home, "grow-class", generations=1)
    labels = store.load_task().labels
    at = run("grow-class", "pages/labels.py")
    picker = next(b for b in at.selectbox if b.key.startswith("grow_class_"))  # keyed by the counts it shows
    counts = [int((store.gold(FITNESS) == c).sum()) for c in range(len(labels))]
    assert list(picker.options) == [f"{labels[c]} ({counts[c]} dev rows)" for c in np.argsort(counts, kind="stable")]
    picker.set_value(labels.index("SPAM")).run()
    assert "Ranked by how many words they share with SPAM's dev rows" in texts(at)
    shown = at.data_editor[0].value
    assert list(shown["id"]) == list(rows_of_class(store, labels.index("SPAM"))["id"])
    at.session_state[at.data_editor[0].key] = {"edited_rows": {0: {"your label": "SPAM"}}, "added_rows": [],
                                               "deleted_rows": []}
    at.text_input(key="grow_class_who").input("ana")
    button(at, "Add these rows to dev").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    record = store_of(home, "grow-class").expert_labels().set_index("example_id")
    assert list(record.index) == [shown["id"][0]] and record.loc[shown["id"][0], "note"] == "found as likely SPAM"
    assert store_of(home, "grow-class").examples_frame("dev", ids=[shown["id"][0]])["label"].tolist() == [
        labels.index("SPAM")]
    # with soft labels saved, the rows are those they give the class the highest probability
    assert start_labels(home / "grow-class", "mv", compare=False).wait(180)
    at = run("grow-class", "pages/labels.py")
    at.selectbox(key="aggregator").set_value("mv").run()
    next(b for b in at.selectbox if b.key.startswith("grow_class_")).set_value(labels.index("HAM")).run()
    saved = load_labels(home / "grow-class", "mv")
    assert "Ranked by the saved soft labels' probability of HAM (mv)" in texts(at)
    offered = next(e.value for e in at.data_editor if "probability" in e.value.columns)
    assert list(offered["id"]) == list(rows_of_class(store, labels.index("HAM"),
                                                     saved=(saved.example_ids, saved.probs))["id"])
    assert shown["id"][0] not in set(offered["id"])


def test_labels_of_the_text_alone_are_not_called_stale_when_only_the_pool_changed(home):
    """A rejection asked for a 65-second recompute of labels that read no vote (a browser walk): a model of the text
    alone is left in peace (auto, which may choose otherwise with the new pool, says so)."""
    from engine.expert.review import reject

    store = seed(home, "stale-text", generations=1)
    for aggregator in ("embedding", "mv"):
        assert start_labels(home / "stale-text", aggregator, compare=False).wait(180)
    reject(store, store.pool_ids()[0], "fires on song titles")
    at = run("stale-text", "pages/labels.py")
    at.selectbox(key="aggregator").set_value("embedding").run()
    assert "The pool changed" not in texts(at)  # a fixed model of the text alone: nothing to recompute
    at.selectbox(key="aggregator").set_value("mv").run()
    assert "The pool changed since these soft labels were computed: recompute" in texts(at)


def test_the_downloads_describe_the_labels_they_hold_after_the_pool_and_dev_change(home):
    """The manifest names the pool that made the saved labels (and says the pool changed since), counts a
    spreadsheet-safe CSV's quoted cells, and the download frame's splits follow rows labeled into dev since."""
    from engine.expert.review import reject
    from engine.expert.rows import label_rows

    store = seed(home, "changed-since", generations=1)
    assert start_labels(home / "changed-since", "mv", compare=False).wait(180)
    saved = load_labels(home / "changed-since", "mv")
    made_by = store.pool_ids()
    assert list(saved.pool_ids) == made_by
    frame = labels_ui.labeled_frame("changed-since", saved)
    manifest = json.loads(labels_ui.manifest_json(store, saved, frame, spreadsheet=True))
    assert manifest["pool_changed_since"] is False
    assert manifest["spreadsheet_safe"]["quoted_cells"] == export.spreadsheet_safe(frame)[1]
    reject(store, made_by[0], "fires on song titles")
    row = str(frame.loc[frame["split"] == "pool", "id"].iloc[0])
    with SandboxExecutor() as executor:
        label_rows(store, executor, {row: "SPAM"}, by="tester")
    manifest = json.loads(labels_ui.manifest_json(store, saved, labels_ui.labeled_frame("changed-since", saved)))
    assert [a["id"] for a in manifest["pool"]] == made_by and manifest["pool_changed_since"] is True
    assert set(manifest["pool_verdicts"]) == set(made_by) and "spreadsheet_safe" not in manifest
    again = labels_ui.labeled_frame("changed-since", saved).set_index("id")
    assert (again.loc[row, "split"], again.loc[row, "gold_label"]) == ("dev", "SPAM")


def test_a_multi_label_task_from_the_import_form_to_the_labels_screen(tmp_path, monkeypatch):
    from test_multilabel import write_csv  # the topics data: cue words for one or two of three labels

    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "ml"))
    workdir = tmp_path / "ml" / "topics"
    Store.open(workdir)
    write_csv(tmp_path / "topics.csv")
    at = run("topics")
    at.file_uploader(key="upload").upload("topics.csv", (tmp_path / "topics.csv").read_bytes(), "text/csv")
    at.run()
    at.checkbox(key="map_multi").check().run()
    assert at.text_input(key="map_sep").value == "|"
    assert at.text_input(key="map_labels").value == "politics, sports, tech"  # cells split on the separator
    import_and_wait(at, workdir)
    assert not at.exception and "Imported 120 rows" in texts(at)
    assert Store.open(workdir).load_task().multi_label
    rows = at.dataframe[0].value  # the dev rows show their whole label set
    assert "politics, sports" in set(rows["label"]) and "sports" in set(rows["label"])

    with SandboxExecutor() as executor:
        evolve(Store.open(workdir), OfflineProposer(), executor, 1)
    job = start_labels(workdir, "evoagg", compare=False)
    assert job.wait(180) and job.status == "done", job.error
    at = run("topics", "pages/labels.py")
    assert "mv" not in at.selectbox(key="aggregator").options  # vote-only aggregators cannot label it
    at.selectbox(key="aggregator").set_value("evoagg").run()
    assert not at.exception
    assert metrics(at)["Rows labeled"].endswith("/ 120") and len(at.get("plotly_chart")) == 3
    table = table_with(at, "n_votes")
    assert {"labels", "confidence", "p_politics", "p_sports", "p_tech"} <= set(table.columns)
    assert "label" not in table.columns
    at.multiselect(key="browse_class").set_value(["tech"]).run()
    assert all("tech" in s.split("|") for s in table_with(at, "n_votes")["labels"])
    # the threshold moves the decisions without a refit; rows labeled follow it
    saved = load_labels(workdir, "evoagg")
    assert at.slider(key="labels_threshold").value == 0.5
    at.slider(key="labels_threshold").set_value(0.95).run()
    assert not at.exception
    strict = (saved.probs >= 0.95).any(axis=1).sum()
    assert metrics(at)["Rows labeled"] == f"{strict:,} / 120" and strict < (saved.probs >= 0.5).any(axis=1).sum()
    at = run("topics", "pages/analytics.py")
    assert "Pool dev macro-F1" in metrics(at)
    # the dev share of each class counts label sets, as the Labels screen's class balance does (not first labels)
    bars = next(t for c in charts(at) for t in c["data"] if t.get("name") == "share of the class in dev")
    store = Store.open(workdir)
    shares = values(bars["y"])
    assert shares == pytest.approx(list(score.class_shares(store.gold("dev"), 3)))
    assert sum(shares) > 1.0  # rows with two labels count for both



def label_like_rows(at: AppTest, regression_id: str, edits: dict[int, object], column: str, who: str = "ana"):
    """Select the regression row `regression_id`, give the rows like it (by position) `edits` in `column` of the
    editor and submit; returns the editor's rows as drawn before the edit."""
    table = next(d for d in at.dataframe if "predicted" in d.value.columns)
    picked = list(table.value["id"]).index(regression_id)
    at.session_state[table.key] = {"selection": {"rows": [picked], "columns": [], "cells": []}}
    at.run()
    editor = at.data_editor[0]
    like = editor.value
    assert column in like.columns, list(like.columns)
    at.session_state[editor.key] = {"edited_rows": {i: {column: v} for i, v in edits.items()}, "added_rows": [],
                                    "deleted_rows": []}
    at.text_input(key="expert_name").input(who)
    button(at, "Add the labeled rows to dev").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return like


def test_rows_like_a_multi_label_regression_row_get_a_label_set_each(tmp_path, monkeypatch):
    from test_multilabel import write_csv  # the topics data: cue words for one or two of three labels

    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "ml"))
    write_csv(tmp_path / "topics.csv")
    data = pd.read_csv(tmp_path / "topics.csv", keep_default_na=False)
    data.loc[data["id"] == "dev-1", "label"] = "sports"  # a politics row mislabeled: one the labels get wrong
    data.to_csv(tmp_path / "topics.csv", index=False)
    store = seed(tmp_path / "ml", "topics", generations=1, options=IngestOptions(multi_label=True),
                 data=tmp_path / "topics.csv")
    job = start_labels(store.path.parent, "evoagg", compare=False)
    assert job.wait(180) and job.status == "done", job.error
    at = run("topics", "pages/labels.py")
    at.selectbox(key="aggregator").set_value("evoagg").run()
    # a label outside the label set is refused, naming the row and the label; nothing moves
    like = label_like_rows(at, "dev-1", {0: ["politics", "weather"]}, "your labels")
    assert f"row {like['id'][0]}: ['weather'] not in the label set" in texts(at)
    assert like["id"][0] in store_of(tmp_path / "ml", "topics").example_ids("pool")
    like = label_like_rows(at, "dev-1", {0: ["politics", "sports"], 1: ["tech"], 2: []}, "your labels")
    now = store_of(tmp_path / "ml", "topics")
    moved = now.examples_frame("dev", ids=list(like["id"][:3]))
    assert dict(zip(moved["id"], moved["label_set"], strict=True)) == {like["id"][0]: (0, 1), like["id"][1]: (2,)}
    record = table_with(at, "by")
    assert dict(zip(record["id"], record["label"], strict=True)) == {like["id"][0]: "politics, sports",
                                                                      like["id"][1]: "tech"}

# ---- safe markdown ------------------------------------------------------------------------------------
def test_data_text_cannot_become_markup():
    from studio.queries import escape_md

    nasty = "**bold** :red[x] $x^2$ <b>tag</b> [link](http://e.vil) `code` # head\n- item"
    out = escape_md(nasty)
    assert "\n" not in out
    for i, ch in enumerate(out):
        if ch in "*:[]$<>`#-()":
            assert out[i - 1] == "\\", (ch, out[max(0, i - 5): i + 5])
    assert "http\\:\u200b" not in out and "\u200b" in out  # no bare URL for markdown to auto-link



@pytest.mark.parametrize(("label", "span"), [("SPAM", "`SPAM`"), ("a`b", "``a`b``"), ("`odd``", "``` `odd`` ```"),
                                             ("two\nlines", "`two lines`")])
def test_a_label_is_one_code_span_whatever_backticks_it_holds(label, span):
    """The Project screen set each label in single backticks: one holding a backtick broke the line's markup."""
    from markdown_it import MarkdownIt

    from studio.queries import code_span

    assert code_span(label) == span
    html = MarkdownIt().renderInline(f"{code_span(label)}, {code_span('next')}")
    assert html.count("<code>") == 2 and "<code>next</code>" in html

def test_the_words_that_made_it_fire_are_highlighted_and_escaped():
    from studio.editor import cue_words, highlighted

    source = ("import re\nLABEL = 'SPAM'\nCUES = ('check', 'chan*', 'my')\n"
              "def annotate(example):\n    return LABEL if 'check' in example['text'] else None\n")
    words = cue_words(source, {"SPAM", "HAM"})
    assert words == ["chan*", "check", "my"]
    assert highlighted("Check *my* channel!", words) == (
        ":orange-background[**Check**] \\*:orange-background[**my**]\\* :orange-background[**channel**]\\!")
    assert highlighted("mystery", ["my"]) == "mystery"  # whole words only (a '*' cue matches a prefix)
    assert cue_words("CUES = ('a',)\n", {"SPAM"}) == ["a"]  # a one-letter cue is still a cue
    assert highlighted("a cat", ["a"]) == ":orange-background[**a**] cat"


def test_stop_now_asks_first_then_stops_the_run(home):
    import threading

    from engine.jobs import start_evolve

    seed(home, "stop-me", generations=1)
    gate = threading.Event()

    class HeldProposer:  # holds the run inside generation 2 until the test lets go
        name = "held"

        def propose(self, role, context):
            gate.wait(30)
            return []

    job = start_evolve(home / "stop-me", 3, proposer=HeldProposer())
    try:
        at = run("stop-me", "pages/evolve.py")
        assert "Generation 2" in texts(at)  # the live panel: which generation is running
        at.button(key="evolve_stop_now").click().run()
        assert "Stop now? The unfinished generation is thrown away" in texts(at)
        assert not job.stop_requested  # nothing happens before the expert confirms
        at.button(key="yes_stop_now").click().run()
        assert job.stop_now
    finally:
        gate.set()
    assert job.wait(60) and job.status == "stopped"
    assert Store.open(home / "stop-me").last_complete_generation() == 1


def test_llm_agents_run_from_the_studio_against_an_openai_compatible_endpoint(home):
    from fake_openai_server import FakeOpenAIServer

    seed(home, "llm-me", generations=0)
    keyword = ("def annotate(example):\n"
               "    return 'SPAM' if 'subscribe' in example['text'].lower() else None\n")
    with FakeOpenAIServer() as server:
        for _ in range(40):  # every call gets the same annotator; evolve keeps one copy
            server.reply(f"A subscribe cue.\n\n```python\n{keyword}```\n")
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params["ws"] = "llm-me"
        at.secrets["OPENAI_API_KEY"] = "sk-test-not-real"
        at.run()
        at.switch_page("pages/evolve.py").run()
        at.radio(key="evolve_agents").set_value("llm").run()
        at.text_input(key="llm_url").input(server.base_url)
        at.text_input(key="llm_model").input("scripted-model").run()
        at.button(key="evolve_start").click().run()
        assert not at.exception
        job = REGISTRY.latest(home / "llm-me", "evolve")
        assert job.params["agents"] == "llm"
        assert job.wait(120) and job.status == "done", job.error
    assert server.requests and {r.body["model"] for r in server.requests} == {"scripted-model"}
    assert server.requests[0].headers["authorization"] == "Bearer sk-test-not-real"
    store = Store.open(home / "llm-me")
    written = [a for a in store.annotators() if "subscribe" in a.source]
    assert len(written) == 1 and written[0].agent == "generator"
    assert store.last_complete_generation() == 1


def test_labels_screen_labels_a_corpus_in_the_background_and_shows_the_cluster_command(home, tmp_path):
    corpus = tmp_path / "comments.csv"
    pd.read_csv(DEMO, dtype=str)[["text"]].head(120).to_csv(corpus, index=False)
    out = tmp_path / "shards"
    at = run(SEEDED, "pages/labels.py")
    at.selectbox(key="aggregator").set_value("mv").run()
    at.text_input(key="corpus_input").input(str(corpus)).run()
    at.text_input(key="corpus_output").input(str(out)).run()
    at.number_input(key="corpus_batch").set_value(100).run()
    command = next(c.value for c in at.code if "evopool label" in c.value)
    assert f"--input {shlex.quote(str(corpus))}" in command and "--engine ray --ray-address" in command
    assert "--aggregator mv" in command
    at.button(key="corpus_start").click().run()
    job = REGISTRY.latest(home / SEEDED, "corpus")
    assert job is not None and job.wait(180) and job.status == "done", job.error
    at.run()
    assert not at.exception
    assert "Labeled 120 rows into 2 shards" in texts(at)
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["engine"] == "local" and [s["rows"] for s in manifest["shards"]] == [100, 20]


def test_a_failed_import_leaves_no_workspace_behind(tmp_path, monkeypatch):
    home = tmp_path / "failing"
    monkeypatch.setenv("EVOPOOL_HOME", str(home))
    at = run()
    at.text_input(key="new_ws").input("legal").run()
    at.button(key="create_ws").click().run()
    assert workspace_names() == ["legal"]  # the one the user made, on purpose
    # an empty upload and an upload whose every row is bad: nothing written, no other workspace appears
    at.file_uploader(key="upload").upload("empty.csv", b"", "text/csv")
    at.run()
    assert "empty" in texts(at).lower() and not at.exception
    at.file_uploader(key="upload").upload("bad.csv", b"id,text,label\n1,,A\n2,,B\n", "text/csv")
    at.run()
    if any(b.key == "do_import" for b in at.button):
        import_and_wait(at, home / "legal")
    assert workspace_names() == ["legal"] and not Store.open(home / "legal").has_data()
    # the demo, when its import fails, removes the workspace it had just made
    broken = tmp_path / "broken.csv"
    broken.write_text("")
    monkeypatch.setattr("studio.workspace.DEMO_CSV", broken)
    at.button(key="load_demo").click().run()
    assert not at.exception and "The demo could not be loaded" in texts(at)
    assert workspace_names() == ["legal"]
    assert sorted(p.name for p in home.iterdir()) == ["legal"]


def workspace_names() -> list[str]:
    from studio import workspace

    return workspace.list_workspaces(empty_too=True)


def test_a_file_fixed_after_the_preview_named_its_bad_rows_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "fix"))
    Store.open(tmp_path / "fix" / "clauses")
    data = tmp_path / "clauses.jsonl"
    data.write_text('{"text": "venue lies in Paris", "label": "venue"}\n{"text": broken\n')
    at = run("clauses")
    at.radio(key="import_source").set_value("A path on the server (file or WRENCH folder)").run()
    at.text_input(key="import_path").input(str(data)).run()
    assert not at.exception and any("1 row(s) of the file cannot be read" in w.value for w in at.warning)
    data.write_text('{"text": "venue lies in Paris", "label": "venue"}\n{"text": "fees are due", "label": "fees"}\n')
    at.run()  # the same path: the cached read was keyed on it alone, and kept showing the bad row
    assert not at.exception and not any("cannot be read" in w.value for w in at.warning)
    assert "2 rows" in texts(at)
    assert at.text_input(key="map_labels").value == "fees, venue"  # the labels the fixed file holds
    data.write_text('{"text": "venue lies in Paris", "label": "venue"}\n{"text": "fees are due", "label": "fee"}\n')
    at.run()  # a typo in a label cell: same name, same row count, other labels
    assert at.text_input(key="map_labels").value == "fee, venue"


def test_a_malformed_wrench_folder_and_a_locked_workspace_are_messages_not_tracebacks(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path / "bad"))
    Store.open(tmp_path / "bad" / "w")
    folder = tmp_path / "wrench"
    folder.mkdir()
    (folder / "label.json").write_text("{not json")
    (folder / "train.json").write_text("{}")
    at = run("w")
    at.radio(key="import_source").set_value("A path on the server (file or WRENCH folder)").run()
    at.text_input(key="import_path").input(str(folder)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(e.value.startswith("wrench could not be read") or "label.json" in e.value for e in at.error), \
        [e.value for e in at.error]
    # another process (an `evopool run`) holds a workspace the expert opens
    with held_by_another_process(tmp_path / "bad" / "busy"):
        at = run("busy")
        assert not at.exception, [e.value for e in at.exception]
        assert any("in use by another process" in e.value for e in at.error), [e.value for e in at.error]


def test_rows_labeled_into_dev_can_go_back_to_the_pool_from_the_labels_screen(home):
    from engine.expert.rows import label_rows

    store = seed(home, "undo-me", generations=1)
    dev_before = store.example_ids("dev")
    pool = store.examples_frame("pool", limit=5)
    with SandboxExecutor() as executor:
        first = label_rows(store, executor, dict(zip(pool["id"][:3], ["SPAM", "HAM", "SPAM"], strict=True)), "ana")
        time.sleep(0.01)  # a later batch: labeled_at is the batch's time
        last = label_rows(store, executor, dict(zip(pool["id"][3:], ["HAM", "SPAM"], strict=True)), "ana")
    at = run("undo-me", "pages/labels.py")
    assert "No soft labels for this aggregator yet" in texts(at)
    assert "Rows labeled into dev in the studio (5)" in texts(at)  # undo needs no soft labels
    job = start_labels(home / "undo-me", "mv", compare=False)
    assert job.wait(180) and job.status == "done", job.error
    at = run("undo-me", "pages/labels.py")
    at.selectbox(key="aggregator").set_value("mv").run()
    assert "Rows labeled into dev in the studio (5)" in texts(at)
    at.button(key="undo_last_rows").click().run()
    # the expert's labels (who, when, why) are dropped for good: one click only asks
    assert "Return 2 row(s) to the unlabeled pool?" in texts(at)
    assert set(store_of(home, "undo-me").example_ids("dev")) >= set(last)
    at.button(key="no_return_rows").click().run()  # cancelled: nothing moves
    assert set(store_of(home, "undo-me").example_ids("dev")) >= set(last)
    assert "Return 2 row(s) to the unlabeled pool?" not in texts(at)
    at.button(key="undo_last_rows").click().run()
    at.button(key="yes_return_rows").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert set(store_of(home, "undo-me").example_ids("pool")) >= set(last)
    assert "2 row(s) went back to the unlabeled pool" in texts(at)
    assert "Rows labeled into dev in the studio (3)" in texts(at)
    chooser = next(m for m in at.multiselect if m.label == "Return rows to the unlabeled pool")
    chooser.set_value([first[1]]).run()
    at.button(key="return_rows_go").click().run()
    assert "Return 1 row(s) to the unlabeled pool?" in texts(at)
    assert first[1] in store_of(home, "undo-me").example_ids("dev")
    at.button(key="yes_return_rows").click().run()
    assert not at.exception, [e.value for e in at.exception]
    now = store_of(home, "undo-me")
    assert set(now.example_ids("dev")) == set(dev_before) | {first[0], first[2]}
    assert "Rows labeled into dev in the studio (2)" in texts(at)


def test_the_import_form_reads_the_label_set_and_task_name_again_for_another_column_or_file(tmp_path, monkeypatch):
    rows = [f"r{i},comment number {i},{'SPAM' if i % 2 else 'HAM'},{'pos' if i % 3 else 'neg'}" for i in range(40)]
    at = upload_into_new_workspace(tmp_path / "follow", monkeypatch, "mine", "comments.csv",
                                   ["id,text,label,tone", *rows])
    assert at.text_input(key="map_labels").value == "HAM, SPAM"
    assert at.text_input(key="map_task_name").value == "comments"
    at.text_input(key="map_labels").input("HAM, SPAM, OTHER").run()  # the curator's own set stays while nothing moves
    at.selectbox(key="map_text").set_value("text").run()
    assert at.text_input(key="map_labels").value == "HAM, SPAM, OTHER"
    at.selectbox(key="map_label").set_value("tone").run()  # another label column: its labels, not the old set
    assert at.text_input(key="map_labels").value == "neg, pos"
    at.file_uploader(key="upload").upload("reviews.csv", "\n".join(["id,text,label", *[r.rsplit(",", 1)[0] for r in
                                                                                     rows]]).encode(), "text/csv")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.text_input(key="map_task_name").value == "reviews"  # the new file's name, not the first one's


def test_the_import_form_offers_every_label_of_a_many_class_file(tmp_path, monkeypatch):
    """77 intents (as in BANKING77): the default label set once stopped at 50, and the import then refused every
    row of the other 27 as 'not in the label set' while the CLI took them all."""
    intents = [f"intent_{i:02d}" for i in range(77)]
    rows = [f"r{i},what the customer asked {i},{intents[i % 77]}" for i in range(154)]
    at = upload_into_new_workspace(tmp_path / "many", monkeypatch, "intents", "intents.csv", ["id,text,label", *rows])
    assert not at.exception, [e.value for e in at.exception]
    assert at.text_input(key="map_labels").value == ", ".join(intents)
    assert not any("bad row" in w.value for w in at.warning), [w.value for w in at.warning]


def test_a_label_with_a_comma_survives_the_untouched_label_box(tmp_path, monkeypatch):
    """The box joins the labels with ", " and was read back split on ",": 'yes, definitely' became two labels and
    every row of it was refused."""
    rows = [f'r{i},answer number {i} to the survey,"{("no", "yes, definitely")[i % 2]}"' for i in range(40)]
    at = upload_into_new_workspace(tmp_path / "comma", monkeypatch, "survey", "survey.csv", ["id,text,label", *rows])
    assert at.text_input(key="map_labels").value == "no, yes, definitely"
    assert not any("bad row" in w.value for w in at.warning), [w.value for w in at.warning]
    import_and_wait(at, tmp_path / "comma" / "survey")
    assert not at.exception, [e.value for e in at.exception]
    assert Store.open(tmp_path / "comma" / "survey").load_task().labels == ("no", "yes, definitely")


def test_the_import_form_names_labels_that_differ_only_in_case(tmp_path, monkeypatch):
    """'None' beside 'none' became two classes without a word; the form now says so before anything is written, and
    a label set the curator types is taken as given."""
    rows = [f"r{i},comment number {i} on the video,{('SPAM', 'none')[i % 2]}" for i in range(40)]
    rows[5] = "r5,comment number 5 on the video,None"
    at = upload_into_new_workspace(tmp_path / "case", monkeypatch, "mine", "comments.csv", ["id,text,label", *rows])
    assert at.text_input(key="map_labels").value == "None, SPAM, none"
    errors = " ".join(e.value for e in at.error)
    assert "cannot be imported as it is: labels 'None' (1 row(s), first row 6) and 'none' (19 row(s), first row 2) " \
           "differ only in case" in errors
    import_and_wait(at, tmp_path / "case" / "mine")
    assert not Store.open(tmp_path / "case" / "mine").has_data()
    at.text_input(key="map_labels").input("SPAM, none, None").run()  # the curator says they are three labels
    assert not any("cannot be imported as it is" in e.value for e in at.error), [e.value for e in at.error]
    import_and_wait(at, tmp_path / "case" / "mine")
    assert not at.exception, [e.value for e in at.exception]
    assert Store.open(tmp_path / "case" / "mine").load_task().labels == ("SPAM", "none", "None")


def test_the_llm_budget_fields_show_the_workspaces_limits_so_run_keeps_them(home):
    from engine.llm.costs import Budget

    store = seed(home, "budgeted", generations=0)
    Budget.for_workspace(store, max_calls=1000, max_usd=-1)  # as `evopool run --max-calls 1000` leaves it
    at = run("budgeted", "pages/evolve.py")
    at.radio(key="evolve_agents").set_value("llm").run()
    assert any(e.label.startswith("Sandbox: ") for e in at.expander)  # the walls a model's code runs within
    assert at.number_input(key="llm_calls_budgeted").value == 1000  # was 200, which Run then stored over it
    assert at.number_input(key="llm_usd_budgeted").value == 0.0  # its dollar limit removed: none, not $2
    fresh = seed(home, "unbudgeted", generations=0)
    Budget.for_workspace(fresh)  # what an offline run (or `evopool run` without --max-*) does: sets no budget
    at = run("unbudgeted", "pages/evolve.py")
    at.radio(key="evolve_agents").set_value("llm").run()
    assert at.number_input(key="llm_calls_unbudgeted").value == 200


def test_the_disagreement_filter_sees_the_pool_rows_once_a_labels_job_voted_on_them(home):
    store = seed(home, "disputed", generations=1)
    job = start_labels(home / "disputed", "mv", compare=False)
    assert job.wait(180) and job.status == "done", job.error
    with SandboxExecutor() as executor:  # a new generation: its members have not voted on the pool rows yet
        evolve(store, OfflineProposer(), executor, 2)
    at = run("disputed", "pages/labels.py")
    at.selectbox(key="aggregator").set_value("mv").run()
    at.toggle(key="browse_disputed").set_value(True).run()
    at.selectbox(key="browse_split").set_value("pool").run()
    assert "; 0 matching rows)" in " ".join(n.label for n in at.number_input)  # nothing known about the pool yet
    job = start_labels(home / "disputed", "mv", compare=False)  # votes every member on every row
    assert job.wait(180) and job.status == "done", job.error
    at.run()
    matching = next(n.label for n in at.number_input if "matching rows" in n.label)
    assert "; 0 matching rows" not in matching, matching  # the cached empty answer was kept before


def test_the_timeline_and_the_audit_metric_agree_after_the_expert_changes_the_pool(home):
    from engine.expert.review import reject

    store = seed(home, "judged", generations=2, options=IngestOptions(audit_fraction=0.5))
    first = store.pool_ids()[0]
    reject(store, first, "not our guideline")  # counts from generation 2: the stored figure predates it
    members = store.pool_ids()
    fitness = score.pool_macro_f1(store.vote_matrix(members, FITNESS).votes, store.label_indices(FITNESS), 2)
    audit = score.pool_macro_f1(store.vote_matrix(members, AUDIT).votes, store.label_indices(AUDIT), 2)
    at = run("judged", "pages/analytics.py")
    metric = next(m for m in at.metric if m.label == "Pool audit macro-F1")
    assert metric.delta == f"{audit - fitness:+.3f} vs fitness"
    lines = {t.get("name"): t for c in charts(at) if "Generations" in c["layout"]["title"]["text"] for t in c["data"]}
    assert lines["fitness macro-F1"]["y"][-1] == pytest.approx(fitness)  # was the stored, pre-verdict figure
    assert lines["audit macro-F1"]["y"][-1] == pytest.approx(audit)
    stored = store.generations()["dev_macro_f1_after"].iloc[-1]
    assert stored != pytest.approx(fitness), "the rejection should move the fitness figure for this test to bite"


def test_without_audit_rows_the_timeline_and_the_dev_metric_agree_after_the_expert_changes_the_pool(home):
    """The demo has no audit rows (dev is too small): the timeline beside the Pool dev macro-F1 metric drew each
    generation's stored figure, so after a rejection its last point (and pool size) disagreed with the metric."""
    from engine.expert.review import reject

    store = seed(home, "judged-no-audit", generations=2)
    assert not store.count_examples(AUDIT)
    reject(store, store.pool_ids()[0], "not our guideline")
    members = store.pool_ids()
    dev = score.pool_macro_f1(store.vote_matrix(members, FITNESS).votes, store.label_indices(FITNESS), 2)
    assert store.generations()["dev_macro_f1_after"].iloc[-1] != pytest.approx(dev), "the rejection must bite"
    analytics = run("judged-no-audit", "pages/analytics.py")
    assert metrics(analytics)["Pool dev macro-F1"] == f"{dev:.3f}"
    assert metrics(analytics)["Annotators in the pool"] == str(len(members))
    for at in (analytics, run("judged-no-audit", "pages/evolve.py")):
        lines = {t.get("name"): t for c in charts(at) if "Generations" in c["layout"]["title"]["text"]
                 for t in c["data"]}
        assert lines["dev macro-F1"]["y"][-1] == pytest.approx(dev)
        assert values(lines["pool size"]["y"])[-1] == len(members)


def test_a_task_with_hundreds_of_labels_names_a_few_and_tables_the_rest(home, tmp_path):
    """600 labels filled the Project screen's labels line and the Evolve screen's thin-class warning (about 8,800
    characters each); each now names the first ones and puts every label in a table under it."""
    labels = [f"intent_{i:03d}" for i in range(300)]
    rows = [(f"row {i} about {label}", label) for i, label in enumerate(labels * 2)]
    csv = tmp_path / "intents.csv"
    pd.DataFrame(rows, columns=["text", "label"]).to_csv(csv, index=False)
    seed(home, "intents", generations=1, data=csv)  # the Evolve screen's notes follow a complete generation
    Store.close_all()
    at = run("intents")
    assert "300 labels:** `intent_000`" in texts(at) and "and 260 more" in texts(at)
    assert "intent_299" not in " ".join(m.value for m in at.markdown)
    assert "All 300 labels" in [e.label for e in at.expander]
    at = run("intents", "pages/evolve.py")
    warning = next(w.value for w in at.warning if "Too few dev rows" in w.value)
    assert "intent\\_000" in warning and "and 288 more classes" in warning and "intent\\_299" not in warning
    assert len(warning) < 2_000
    assert "All 300 classes with too few dev rows" in [e.label for e in at.expander]


def test_the_help_beside_auto_says_how_its_choice_was_judged_and_why_it_stands():
    """The labels screen's help on auto's choice: what uses the pool (a mean holding a student of it included) was
    judged on the audit rows; a student of the text alone on all dev rows; and a student is explained as one."""
    from engine.domain import AutoChoice

    mean = labels_ui._auto_help(AutoChoice("avg(student<avg(evoagg[masked],evoagg[relation])>,"
                                           "student<avg(masked-only,relation-only)>)", "audit"), 99)
    assert "judged on 99 audit rows" in mean and "A student learns" in mean and "a mean was taken" in mean
    text = labels_ui._auto_help(AutoChoice("student<avg(embedding-only,tfidf-only)>", "audit"), 99)
    assert "judged on all dev rows (it never reads the pool)" in text
    alone = labels_ui._auto_help(AutoChoice("student<embedding-only>", "dev"), None)
    assert "nothing that uses the pool was weighed" in alone
    assert "student" not in labels_ui._auto_help(AutoChoice("evoagg[tfidf]", "audit"), 99).split(":")[0]


def test_undo_on_the_annotator_screen_returns_to_the_gates_verdict(home):
    """After a rejection, "Undo my reject" puts the gate's verdict back (accept: in the pool again, no lock), not an
    approval of the expert's."""
    seed(home, "undo-here", generations=1)
    at = run("undo-here", "pages/annotator.py")
    shown = at.selectbox(key="pick_annotator").value
    assert not any(b.label.startswith("Undo") for b in at.button)  # nothing of the expert's to undo yet
    at.text_input(key=f"note_annotator_{shown}").input("fires on song titles")
    next(b for b in at.get("form_submit_button") if b.label.startswith("Reject")).click().run()
    next(b for b in at.button if b.label == "Undo my reject").click().run()
    assert not at.exception and metrics(at)["Verdict"] == "accept"
    store = Store.open(home / "undo-here")
    assert shown in store.pool_ids() and shown not in store.human_locked()
    assert not any(b.label.startswith("Undo") for b in at.button)
    # reject, then approve: the pool is as it was, the screen must still show the expert's approve (it showed the
    # cached "accept" of before, keyed by the pool)
    at.text_input(key=f"note_annotator_{shown}").input("too broad")
    next(b for b in at.get("form_submit_button") if b.label.startswith("Reject")).click().run()
    at.text_input(key=f"note_annotator_{shown}").input("on second thought")
    next(b for b in at.get("form_submit_button") if b.label.startswith("Approve")).click().run()
    assert metrics(at)["Verdict"] == "approve" and any(b.label == "Undo my approve" for b in at.button)


def test_no_undo_is_offered_for_an_annotator_the_expert_wrote(home):
    """Its only verdict is the expert's approval: there is nothing before it to return to, so no undo button (it
    offered one that could only fail); the opposite verdict is there."""
    store = seed(home, "own-annotator", generations=1)
    source = 'def annotate(example):\n    return "SPAM" if "check out" in example["text"].lower() else None\n'
    with SandboxExecutor() as executor:  # saved as the editor saves: the expert's own approval
        mine = review.save_edit(store, executor, source, None, "my own rule", name="check_out_phrase").id
    assert store.latest_verdicts()[mine][1] == "human" and store.undoable(mine) is None
    at = run("own-annotator", "pages/annotator.py", annotator=mine)
    assert at.selectbox(key="pick_annotator").value == mine
    assert not any(b.label.startswith("Undo") for b in at.button)
    assert any(b.label.startswith("Reject") for b in at.get("form_submit_button"))


def test_llm_agents_without_a_key_or_endpoint_say_so_before_run(home, monkeypatch):
    """An expert chose the LLM agents with no key set, pressed Run, and read the failure twice; now the screen says
    what is missing before Run, which stays off until a base URL (a local server needs no key) is given."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    seed(home, "keyless", generations=0)
    at = run("keyless", "pages/evolve.py")
    assert not at.button(key="evolve_start").disabled
    at.radio(key="evolve_agents").set_value("llm").run()
    said = [w.value for w in at.warning if "cannot run yet" in w.value]
    assert len(said) == 1 and "no API key" in said[0]
    assert at.button(key="evolve_start").disabled
    at.text_input(key="llm_url").input("http://127.0.0.1:9/v1").run()
    assert not [w for w in at.warning if "cannot run yet" in w.value]
    assert not at.button(key="evolve_start").disabled
    assert REGISTRY.latest(home / "keyless", "evolve") is None  # nothing was started


# ---- label rows (the keyboard screen) -------------------------------------------------------------------------------
def test_a_row_another_expert_labeled_meanwhile_says_so_after_the_key_press(home):
    """Two sessions were shown the same row; the second key press wrote nothing and its error vanished with the
    rerun that followed, so the expert never knew (bench/team_load.py counted such labels lost)."""
    from engine.apply.executor import CompiledExecutor
    from engine.expert.rows import label_rows

    store = seed(home, "teach-twice", generations=1)
    at = run("teach-twice", "pages/teach.py")
    at.text_input(key="teach_who").set_value("ben").run()
    shown = next(c.value for c in at.caption if c.value.startswith("Row "))
    row_id = next(i for i in store.example_ids("pool") if f"Row {escape_md(i)} ·" in shown)
    with CompiledExecutor() as executor:
        label_rows(store, executor, {row_id: store.load_task().labels[0]}, "ana", note="the other session")
    at.button(key="teach_label_1").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(w.value.startswith("Not recorded:") for w in at.warning), [w.value for w in at.warning]
    assert list(store.expert_labels()["labeled_by"]) == ["ana"]  # ana's label stands, ben's wrote nothing


def test_label_rows_screen_labels_skips_and_undoes(home):
    store = seed(home, "teach-me", generations=1)
    labels = store.load_task().labels
    dev_before = store.count_examples("dev")
    at = run("teach-me", "pages/teach.py")
    at.text_input(key="teach_who").set_value("ana").run()
    first = next(c.value for c in at.caption if c.value.startswith("Row "))
    assert "picked because" in first
    at.button(key="teach_label_0").click().run()  # key 1: the first label
    assert not at.exception, [e.value for e in at.exception]
    assert store.count_examples("dev") == dev_before + 1
    record = store.expert_labels()
    assert list(record["labeled_by"])[-1] == "ana"
    second = next(c.value for c in at.caption if c.value.startswith("Row "))
    assert second != first
    at.button(key="teach_skip").click().run()
    third = next(c.value for c in at.caption if c.value.startswith("Row "))
    assert third not in (first, second) and store.count_examples("dev") == dev_before + 1
    at.button(key="teach_undo").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert store.count_examples("dev") == dev_before
    back = next(c.value for c in at.caption if c.value.startswith("Row "))
    assert first.split(" · ")[0] == back.split(" · ")[0] and "taken back" in back
    counts = next(d.value for d in at.dataframe if "labeled here" in d.value)
    assert counts["labeled here"].sum() == 0 and list(counts["class"]) == list(labels)
