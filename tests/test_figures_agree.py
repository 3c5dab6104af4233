"""One source of truth: every screen, rendered under AppTest on a workspace built by the CLI, shows the figures
`evopool eval` / `evopool pool` print as JSON for the same workspace: the same dev macro-F1 of the pool and of
auto, the same aggregator auto chose, the same pool size, generation, row counts and annotator precision."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import DEMO_CSV, charts, values
from streamlit.testing.v1 import AppTest
from test_cli import evopool

from engine.jobs import start_labels
from engine.store.saved_labels import load_labels

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "streamlit_app.py")
WS = "agree"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A workspace from `evopool run`, the CLI's JSON about it, and the studio's saved auto labels."""
    home = tmp_path_factory.mktemp("agree_home")
    ws = str(home / WS)
    _, out = evopool("run", str(DEMO_CSV), "--workdir", ws, "--generations", "2", "--seed", "0")
    assert out.returncode == 0, out.stderr
    facts = {"home": home}
    for aggregator in ("mv", "auto", "auto-text"):
        facts[aggregator], out = evopool("eval", "--workdir", ws, "--split", "dev", "--aggregator", aggregator)
        assert out.returncode == 0, out.stderr
    lines = subprocess.run([sys.executable, "-m", "engine.cli", "pool", "--workdir", ws], capture_output=True,
                           text=True, check=True).stdout.strip().splitlines()
    facts["pool"] = [json.loads(line) for line in lines]
    job = start_labels(home / WS, "auto", compare=False)  # what the labels screen's button starts
    assert job.wait(600) and job.status == "done", job.error
    facts["saved"] = load_labels(home / WS, "auto")
    return facts


@pytest.fixture(autouse=True)
def _home(built, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(built["home"]))


def render(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["ws"] = WS
    at.query_params.update(params)
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_the_cli_workspace_has_no_audit_rows_so_dev_is_what_every_screen_scores():
    # the demo's 120 dev rows are too few for audit rows: every dev figure below is on the same 120 rows
    at = render("pages/project.py")
    assert metrics(at)["Dev (labeled)"] == "120"


def test_project_screen_and_sidebar_agree_with_eval(built):
    at = render("pages/project.py")
    assert metrics(at)["Dev (labeled)"] == str(built["mv"]["n"])
    facts = "\n".join(c.value for c in at.sidebar.caption)
    assert f"generation {built['mv']['generation']}" in facts
    assert f"{built['mv']['pool_size']} annotators in the pool" in facts


def test_evolve_and_analytics_show_the_pool_dev_macro_f1_eval_gives_for_mv(built):
    expected = built["mv"]["macro_f1"]  # 4 decimals
    at = render("pages/evolve.py")
    assert metrics(at)["Complete generations"] == str(built["mv"]["generation"])
    spec = charts(at)[0]
    line = next(t for t in spec["data"] if t.get("name") == "dev macro-F1")  # no audit rows: all of dev
    y = values(line["y"])
    assert round(float(y[-1]), 4) == pytest.approx(expected, abs=1e-4)
    at = render("pages/analytics.py")
    assert metrics(at)["Pool dev macro-F1"] == f"{expected:.3f}"
    assert metrics(at)["Annotators in the pool"] == str(built["mv"]["pool_size"])


def test_labels_screen_shows_the_aggregator_and_dev_macro_f1_eval_gives_for_auto(built):
    auto, saved = built["auto"], built["saved"]
    assert saved.dev_scores.choice.chosen == auto["chosen"]  # the studio's job and the CLI choose alike
    at = render("pages/labels.py")
    shown = "\n".join([c.value for c in at.caption] + [m.value for m in at.markdown])
    assert f"Auto chose {auto['chosen']}" in shown
    assert ("auto keeps it over its teacher unless" in shown) == auto["chosen"].startswith("student<")
    assert metrics(at)["Labels' dev macro-F1"] == f"{auto['macro_f1']:.3f}"


def test_annotator_screen_shows_the_precision_and_fires_evopool_pool_prints(built):
    for member in built["pool"][:3]:
        at = render("pages/annotator.py", annotator=member["id"])
        shown = metrics(at)
        assert shown["Precision (dev)"] == f"{member['precision']:.2f}"
        assert shown["Fires"] == str(member["fires"])


def test_labels_screen_says_whether_the_pool_earns_its_place_with_the_figures_eval_gives(built):
    """The comparison's verdict: auto against auto-text, each with the dev macro-F1 `evopool eval` prints."""
    text = built["auto-text"]
    job = start_labels(built["home"] / WS, "mv", compare=True)  # its own saved file: auto's stays as the others read it
    assert job.wait(600) and job.status == "done", job.error
    at = render("pages/labels.py")
    at.selectbox(key="aggregator").select("mv").run()
    assert not at.exception, [e.value for e in at.exception]
    auto = built["auto"]
    # the best model without the pool: auto-text's choice, or a text-only model of the table above it
    shown = next(d.value for d in at.dataframe if "dev macro-F1 (out-of-fold)" in d.value.columns)
    embedding = float(shown.set_index("aggregator").loc["embedding", "dev macro-F1 (out-of-fold)"])
    theirs = max(text["macro_f1"], embedding)
    earns = auto["uses_pool"] and auto["macro_f1"] > theirs
    said = [box.value for box in (at.success if earns else at.info) if "for the best model without" in box.value]
    assert len(said) == 1, [box.value for box in list(at.success) + list(at.info)]
    assert f"{auto['macro_f1']:.3f} dev macro-F1 (out-of-fold) against {theirs:.3f}" in said[0]
    assert (f"(auto-text: {text['chosen']})" if theirs == text["macro_f1"] else "(embedding)") in said[0]
    assert ("earns its place here" in said[0]) == earns


def _comparison(auto: dict, text: dict) -> pd.DataFrame:
    return pd.DataFrame.from_records([{"aggregator": "mv", "macro_f1": 0.5}, {"aggregator": "auto", **auto},
                                      {"aggregator": "auto-text", **text}])


def test_pool_verdict_reads_which_way_auto_chose_and_warns_without_audit_rows():
    from studio.labels_ui import pool_verdict

    text = {"macro_f1": 0.81, "chosen": "student<embedding-only>", "uses_pool": False, "chosen_on": "audit"}
    earns, said = pool_verdict(_comparison({"macro_f1": 0.8449, "chosen": "student<evoagg[embedding]>",
                                            "uses_pool": True, "chosen_on": "audit"}, text))
    assert earns and "0.845 dev macro-F1 (out-of-fold) against 0.810" in said and "lean optimistic" not in said
    # a student reads only the text when it labels: it learned from the votes, it does not read them (the screen's
    # caption says "reads only the text" beside it)
    assert "learned from a teacher that reads the pool's votes" in said and "choice reads the pool's votes" not in said
    earns, said = pool_verdict(_comparison({"macro_f1": 0.85, "chosen": "evoagg[embedding]", "uses_pool": True,
                                            "chosen_on": "dev"}, text))
    assert earns and "There are no audit rows" in said and "lean optimistic" in said
    assert "auto's choice reads the pool's votes" in said  # EvoAgg reads them on every row it labels
    earns, said = pool_verdict(_comparison({"macro_f1": 0.85, "chosen": "evoagg[embedding]", "uses_pool": True,
                                            "chosen_on": "dev", "n_audit": 40}, text))
    assert earns and "too few audit rows (40) to judge it" in said
    # chosen on its audit-row figure but behind the text on all dev rows: no claim of a lead
    earns, said = pool_verdict(_comparison({"macro_f1": 0.80, "chosen": "evoagg[embedding]", "uses_pool": True,
                                            "chosen_on": "audit"}, text))
    assert not earns and "does not lead yet" in said and "earns its place here" not in said
    earns, said = pool_verdict(_comparison({"macro_f1": 0.81, "chosen": "student<embedding-only>",
                                            "uses_pool": False, "chosen_on": "audit"}, text))
    assert not earns and "text alone does as well" in said and "describe the weak classes" in said
    assert pool_verdict(_comparison({"macro_f1": 0.8}, text).iloc[:2]) is None  # no auto-text row
    # a text-only model of the table above auto: the pool does not lead, whatever auto-text's choice scored
    beaten = pd.concat([_comparison({"macro_f1": 0.924, "chosen": "evoagg[embedding]", "uses_pool": True,
                                     "chosen_on": "audit"}, {**text, "macro_f1": 0.915}),
                        pd.DataFrame.from_records([{"aggregator": "embedding", "macro_f1": 0.932}])])
    earns, said = pool_verdict(beaten)
    assert not earns and "against 0.932 for the best model without the pool (embedding)" in said
    assert pool_verdict(pd.DataFrame()) is None


def test_the_comparison_table_names_its_columns_and_leaves_no_none_in_its_cells():
    """An expert read raw `uses_pool` and `left_out` headers and "None" cells on the Labels screen."""
    from studio.labels_ui import comparison_table

    raw = pd.DataFrame.from_records([
        {"aggregator": "mv", "macro_f1": 0.95, "uses_pool": True, "left_out": None, "chosen": None},
        {"aggregator": "auto", "macro_f1": 0.92, "uses_pool": False, "left_out": ["mv", "ds"],
         "chosen": "student<embedding-only>"},
        {"aggregator": "auto-text", "macro_f1": 0.90, "uses_pool": None, "left_out": float("nan"), "chosen": None}])
    table = comparison_table(raw)
    assert "uses_pool" not in table and "left_out" not in table
    assert table["uses the pool's votes"].tolist() == ["no", "", "yes"]
    assert table["auto left out (the pool was chosen on these rows)"].tolist() == ["mv, ds", "", ""]
    assert "None" not in table.astype(str).to_numpy().ravel().tolist()
    # what auto left out says so on its own row, after the rows auto weighed, whatever its (inflated) figure
    assert table["aggregator"].tolist() == ["auto", "auto-text", "mv"]
    assert table["auto's view"].tolist()[:2] == ["", ""] and "inflated" in table["auto's view"].tolist()[2]


def test_the_labels_screen_says_why_auto_kept_a_student_below_a_model_it_weighed():
    """On the demo auto's row read 0.916 under embedding's 0.932 with no word why: it keeps a student unless its
    teacher beats it in every bootstrap draw."""
    from studio.labels_ui import comparison_table, student_note

    def comparison(chosen: str, left_out: list[str]) -> pd.DataFrame:
        return pd.DataFrame.from_records([
            {"aggregator": "mv", "macro_f1": 0.96}, {"aggregator": "embedding", "macro_f1": 0.932},
            {"aggregator": "auto", "macro_f1": 0.916, "chosen": chosen, "left_out": left_out},
            {"aggregator": "auto-text", "macro_f1": 0.916}])

    # evoagg is auto's evoagg[embedding]: left out there, it is marked here and is no model auto weighed
    table = comparison_table(comparison("student<embedding-only>", ["mv", "evoagg[embedding]"]).assign(
        aggregator=lambda f: f["aggregator"].replace({"mv": "evoagg"})))
    assert "inflated" in table.set_index("aggregator").loc["evoagg", "auto's view"]
    said = student_note(comparison("student<avg(embedding-only,tfidf-only)>", ["mv"]))
    assert said is not None and "below embedding's (0.932)" in said and "38 of 42 runs" in said
    assert student_note(comparison("avg(student<embedding-only>,student<evoagg[embedding]>)", ["mv"])) is not None
    assert student_note(comparison("embedding-only", ["mv"])) is None  # not a student: no such rule at work
    assert student_note(comparison("student<embedding-only>", ["mv", "embedding-only"])) is None  # only left-out above
