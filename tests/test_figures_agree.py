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


def test_labels_screen_leads_with_the_estimate_and_interval_eval_prints_for_auto(built):
    auto, saved = built["auto"], built["saved"]
    assert saved.dev_scores.choice.chosen == auto["chosen"]  # the studio's job and the CLI choose alike
    assert saved.dev_scores.estimate.macro_f1 == auto["estimate"]
    at = render("pages/labels.py")
    shown = "\n".join([c.value for c in at.caption] + [m.value for m in at.markdown])
    assert f"Auto chose {auto['chosen']}" in shown
    low, high = auto["interval"]
    headline = [box.value for box in at.success if box.value.startswith("Expected test")]
    assert len(headline) == 1, [box.value for box in at.success]
    assert (f"expected macro-F1 {auto['estimate']:.2f}, 90% interval {low:.2f}–{high:.2f}, from "
            f"{auto['n_rows']:,} dev rows") in headline[0]
    assert metrics(at)["Expected macro-F1"] == f"{auto['estimate']:.2f}"


def test_annotator_screen_shows_the_precision_and_fires_evopool_pool_prints(built):
    for member in built["pool"][:3]:
        at = render("pages/annotator.py", annotator=member["id"])
        shown = metrics(at)
        assert shown["Precision (dev)"] == f"{member['precision']:.2f}"
        assert shown["Fires"] == str(member["fires"])


def _comparison(auto: dict, text: dict) -> pd.DataFrame:
    return pd.DataFrame.from_records([{"aggregator": "mv", "macro_f1": 0.5}, {"aggregator": "auto", **auto},
                                      {"aggregator": "auto-text", **text}])




def test_labels_screen_says_whether_the_pool_earns_its_place_with_the_estimates_eval_gives(built):
    """The comparison's verdict: auto against auto-text, each with the estimate `evopool eval` prints, and the
    table's rows for them show the same figures."""
    auto, text = built["auto"], built["auto-text"]
    job = start_labels(built["home"] / WS, "mv", compare=True)  # its own saved file: auto's stays as the others read it
    assert job.wait(600) and job.status == "done", job.error
    at = render("pages/labels.py")
    at.selectbox(key="aggregator").select("mv").run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "expected macro-F1" in d.value.columns).set_index("aggregator")
    assert table.loc["auto", "expected macro-F1"] == auto["estimate"]
    assert table.loc["auto-text", "expected macro-F1"] == text["estimate"]
    assert table.loc["auto", "90% interval"] == f"{auto['interval'][0]:.3f}–{auto['interval'][1]:.3f}"
    assert not table.isna().all().any()  # no empty column
    said = [box.value for box in list(at.success) + list(at.info) if "for the best model without" in box.value]
    assert len(said) == 1
    assert f"expected macro-F1 {auto['estimate']:.3f}" in said[0] and f"against {text['estimate']:.3f}" in said[0]


def _comparison(auto: dict, text: dict) -> pd.DataFrame:
    return pd.DataFrame.from_records([{"aggregator": "mv", "estimate": 0.5}, {"aggregator": "auto", **auto},
                                      {"aggregator": "auto-text", **text}])


def test_pool_verdict_weighs_the_estimates_and_their_intervals():
    from studio.labels_ui import pool_verdict

    text = {"estimate": 0.81, "interval": [0.76, 0.85], "chosen": "student<embedding-only>", "uses_pool": False}
    earns, said = pool_verdict(_comparison({"estimate": 0.8449, "interval": [0.82, 0.87],
                                            "chosen": "student<avg(evoagg[embedding],evoagg[tfidf])>",
                                            "uses_pool": True}, text))
    assert earns and "expected macro-F1 0.845" in said and "against 0.810" in said
    assert "inside the interval" not in said  # its low end (0.82) clears the text's figure
    assert "learned from a teacher that reads the pool's votes" in said
    earns, said = pool_verdict(_comparison({"estimate": 0.83, "interval": [0.70, 0.90], "chosen": "evoagg[embedding]",
                                            "uses_pool": True}, text))
    assert earns and "inside the interval" in said and "auto's choice reads the pool's votes" in said
    earns, said = pool_verdict(_comparison({"estimate": 0.80, "interval": [0.75, 0.85], "chosen": "evoagg[embedding]",
                                            "uses_pool": True}, text))
    assert not earns and "does not lead yet" in said
    earns, said = pool_verdict(_comparison({**text, "estimate": 0.81}, text))
    assert not earns and "text alone does as well" in said and "describe the weak classes" in said
    assert pool_verdict(_comparison({"estimate": float("nan"), "uses_pool": True}, text)) is None  # no estimate
    assert pool_verdict(pd.DataFrame()) is None


def test_the_comparison_table_leads_with_the_estimate_and_leaves_no_none_or_empty_column():
    from studio.labels_ui import comparison_table

    raw = pd.DataFrame.from_records([
        {"aggregator": "mv", "estimate": None, "interval": None, "judged_on": None, "macro_f1": 0.99,
         "uses_pool": True, "chosen": None, "left_out": None},
        {"aggregator": "auto", "estimate": 0.91, "interval": [0.88, 0.94], "judged_on": "audit", "macro_f1": 0.92,
         "uses_pool": True, "chosen": "student<evoagg[embedding]>"},
        {"aggregator": "auto-text", "estimate": 0.90, "interval": [0.86, 0.93], "judged_on": "dev", "macro_f1": 0.90,
         "uses_pool": False, "chosen": None}])
    table = comparison_table(raw)
    assert table["aggregator"].tolist() == ["auto", "auto-text", "mv"]  # by the estimate; none last
    assert table["90% interval"].tolist() == ["0.880–0.940", "0.860–0.930", ""]
    assert table["estimated on"].tolist()[2].startswith("none: reads votes chosen on dev")
    assert "uses_pool" not in table and "left_out" not in table and "auto's view" not in table
    assert "None" not in table.drop(columns=["expected macro-F1"]).astype(str).to_numpy().ravel().tolist()
