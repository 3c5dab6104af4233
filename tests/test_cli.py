"""`evopool` as other tools call it: a real subprocess, JSON on the last stdout line."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from engine.agents.choice import AGENT_CHOICES
from engine.aggregators.choice_names import reads_votes
from engine.aggregators.registry import AGGREGATORS, DEFAULT_AGGREGATOR
from engine.cli.parser import build_parser
from engine.domain import AUDIT, FITNESS
from engine.embed.registry import EMBEDDERS
from engine.jobs import start_labels
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store

ROOT = Path(__file__).resolve().parents[1]


def evopool(*args: str) -> tuple[dict | None, subprocess.CompletedProcess]:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None), out


def test_run_eval_export_pool_on_demo(tmp_path, demo_csv):
    ws = str(tmp_path / "ws")
    summary, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "2", "--seed", "0")
    assert out.returncode == 0, out.stderr
    assert summary["generation"] == 2 and summary["pool_size"] > 0
    assert "generation 2:" in out.stderr  # progress goes to stderr

    result, out = evopool("eval", "--workdir", ws, "--split", "test", "--aggregator", "mv")
    assert out.returncode == 0, out.stderr
    assert result["split"] == "test" and result["aggregator"] == "mv" and result["n"] == 250
    assert 0.0 <= result["coverage"] <= 1.0 and 0.0 < result["macro_f1"] <= 1.0

    # auto says what it chose, whether it uses the pool, and what to expect: the demo's 120 dev rows give no audit
    # rows and the pool was chosen on them, so nothing that uses the pool is weighed, and the estimate (with its
    # interval) comes from all dev rows; the pool's own figure is printed beside it
    result, out = evopool("eval", "--workdir", ws, "--split", "test", "--aggregator", "auto")
    assert out.returncode == 0, out.stderr
    assert result["chosen_on"] == "dev" and result["uses_pool"] is False and not reads_votes(result["chosen"])
    assert 0.5 < result["macro_f1"] <= 1.0
    low, high = result["interval"]
    assert low <= result["estimate"] <= high and result["judged_on"] == "dev" and result["n_rows"] == 120
    assert "read no votes" in result["note"]
    assert 0 < result["pool_majority_vote"]["macro_f1"] <= 1 and 0 < result["pool_majority_vote"]["coverage"] <= 1
    dev, out = evopool("eval", "--workdir", ws, "--split", "dev", "--aggregator", "auto")
    assert out.returncode == 0, out.stderr
    assert dev["estimate"] == result["estimate"] and dev["interval"] == result["interval"]  # one figure, both ways
    result, out = evopool("eval", "--workdir", ws, "--split", "test", "--aggregator", "auto-text")
    assert out.returncode == 0, out.stderr
    assert result["uses_pool"] is False and not reads_votes(result["chosen"])

    csv = tmp_path / "labels.csv"
    result, out = evopool("export", "--workdir", ws, "--out", str(csv), "--aggregator", "mv")
    assert out.returncode == 0, out.stderr
    frame = pd.read_csv(csv, keep_default_na=False)
    assert len(frame) == 2056 and result["rows"] == 2056
    assert {"id", "text", "label", "split", "p_HAM", "p_SPAM", "n_votes", "confidence"} <= set(frame.columns)
    labeled = frame[frame["label"] != ""]
    assert ((labeled["p_HAM"] + labeled["p_SPAM"]).round(4) == 1).all()
    assert set(frame["split"]) == {"pool", "dev", "test"}

    # an earlier export (its manifest beside it) is overwritten; anything else is refused before any work; the
    # pool comes as runnable Python on request, as the studio's download gives it
    pool_py = tmp_path / "pool.py"
    result, out = evopool("export", "--workdir", ws, "--out", str(csv), "--aggregator", "mv",
                          "--pool-python", str(pool_py))
    assert out.returncode == 0, out.stderr
    from engine.export.files import pool_as_python

    assert result["pool_python"] == str(pool_py) and pool_py.read_text() == pool_as_python(Store.open(ws))
    database = Path(ws) / "workspace.duckdb"
    before = database.read_bytes()
    other = tmp_path / "notes.csv"
    other.write_text("mine\n")
    for target, said in ((database, "the workspace's own database"), (other, "exists and is not an earlier export"),
                         (tmp_path / "labels.xlsx", "unknown export format 'xlsx'")):
        result, out = evopool("export", "--workdir", ws, "--out", str(target), "--aggregator", "mv", "-v",
                              *(["--format", "csv"] if target == database else []))
        assert out.returncode == 1 and said in out.stderr, out.stderr
        assert "embedding" not in out.stderr.lower()  # refused before the fit
    assert database.read_bytes() == before and other.read_text() == "mine\n"
    assert not (tmp_path / "labels.xlsx").exists()

    lines = subprocess.run([sys.executable, "-m", "engine.cli", "pool", "--workdir", ws], capture_output=True,
                           text=True).stdout.strip().splitlines()
    members = [json.loads(line) for line in lines]
    assert len(members) == summary["pool_size"]
    expected = {"id", "name", "agent", "generation", "author", "precision", "coverage", "fires", "source"}
    assert expected <= set(members[0])


def test_run_imports_the_good_rows_and_names_the_bad_ones_on_request(tmp_path, demo_csv):
    """The studio could keep what was good; the CLI refused a whole file for one bad row, with no way around it."""
    frame = pd.read_csv(demo_csv, keep_default_na=False, dtype=str)
    frame.loc[3, "text"] = ""
    frame.loc[7, "id"] = frame.loc[6, "id"]  # a duplicate id
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    summary, out = evopool("run", str(bad), "--workdir", str(tmp_path / "refused"), "--generations", "1")
    assert out.returncode == 1 and "nothing was imported" in out.stderr and "--skip-bad-rows" in out.stderr
    assert "row 4: empty text" in out.stderr and "row 8" in out.stderr
    summary, out = evopool("run", str(bad), "--workdir", str(tmp_path / "kept"), "--generations", "1",
                           "--skip-bad-rows")
    assert out.returncode == 0, out.stderr
    assert "skipped row 4: empty text" in out.stderr and "skipped row 8" in out.stderr
    assert Store.open(tmp_path / "kept").count_examples() == len(frame) - 2


def test_run_holds_back_audit_rows_on_request(tmp_path, demo_csv):
    ws = tmp_path / "audited"
    summary, out = evopool("run", str(demo_csv), "--workdir", str(ws), "--generations", "1",
                           "--audit-fraction", "0.5")
    assert out.returncode == 0, out.stderr
    assert "held back 60 of 120 dev rows as audit rows" in out.stderr
    store = Store.open(ws)
    assert store.count_examples(AUDIT) == 60 and store.count_examples(FITNESS) == 60
    Store.close_all()


def test_run_takes_the_task_name_and_label_descriptions_at_import(tmp_path, demo_csv):
    labels = sorted(pd.read_csv(demo_csv)["label"].dropna().unique())
    described = tmp_path / "labels.json"
    described.write_text(json.dumps({labels[0]: "what the first class means", "nonsense": "no such label"}))
    ws = tmp_path / "named"
    summary, out = evopool("run", str(demo_csv), "--workdir", str(ws), "--generations", "0",
                           "--task-name", "Comment triage", "--label-descriptions", str(described))
    assert out.returncode == 0, out.stderr
    assert "descriptions given for labels the data does not have (ignored): nonsense" in out.stderr
    store = Store.open(ws)
    task = store.load_task()
    assert task.name == "Comment triage"
    assert dict(task.label_descriptions) == {labels[0]: "what the first class means"}
    Store.close_all()
    bad = tmp_path / "bad.json"
    bad.write_text('["not", "an", "object"]')
    _, out = evopool("run", str(demo_csv), "--workdir", str(tmp_path / "other"), "--label-descriptions", str(bad))
    assert out.returncode == 2 and "expected a JSON object" in out.stderr
    # inline, as the help's FILE|JSON says (it was read as a file name: "No such file or directory")
    inline = json.dumps({labels[1]: "what the second class means"})
    _, out = evopool("run", str(demo_csv), "--workdir", str(tmp_path / "inline"), "--generations", "0",
                     "--label-descriptions", inline)
    assert out.returncode == 0, out.stderr
    assert dict(Store.open(tmp_path / "inline").load_task().label_descriptions) == {
        labels[1]: "what the second class means"}
    Store.close_all()
    _, out = evopool("run", str(demo_csv), "--workdir", str(tmp_path / "broken"), "--label-descriptions", "{oops")
    assert out.returncode == 2 and "--label-descriptions {oops" in out.stderr


def test_generations_that_propose_nothing_are_counted_and_told(tmp_path, demo_csv):
    """The demo's offline agents run dry after two generations: the run says so, with what would grow the pool."""
    summary, out = evopool("run", str(demo_csv), "--workdir", str(tmp_path / "ws"), "--generations", "5")
    assert out.returncode == 0, out.stderr
    proposed = [g.n_candidates for g in Store.open(tmp_path / "ws").generations().itertuples()]
    Store.close_all()
    idle = len(proposed) - max((i + 1 for i, n in enumerate(proposed) if n), default=0)
    assert idle >= 2 and summary["idle_generations"] == idle
    assert f"the last {idle} generations proposed nothing new" in out.stderr and "label more dev rows" in out.stderr
    summary, out = evopool("run", "--workdir", str(tmp_path / "ws"), "--generations", "0")
    assert out.returncode == 0 and "idle_generations" not in summary  # a run of no generation says nothing of it


def test_idle_generations_counts_the_trailing_complete_ones_without_candidates():
    from engine.expert.review import idle_generations

    frame = pd.DataFrame({"number": [1, 2, 3, 4, 5], "n_candidates": [9, 0, 3, 0, 0],
                          "status": ["complete"] * 4 + ["running"]})
    assert idle_generations(frame) == 1  # the running one is not counted, generation 3 proposed
    assert idle_generations(frame.assign(status="complete")) == 2
    assert idle_generations(frame.assign(n_candidates=0, status="complete")) == 5
    assert idle_generations(frame.iloc[:0]) == 0


def test_run_takes_a_label_set_that_keeps_labels_differing_only_in_case_apart(tmp_path):
    rows = [f"r{i},the drug number {i} acts here,{('inhibitor', 'Inhibitor', 'none')[i % 3]}" for i in range(30)]
    data = tmp_path / "rel.csv"
    data.write_text("id,text,label\n" + "\n".join(rows) + "\n")
    _, refused = evopool("run", str(data), "--workdir", str(tmp_path / "a"), "--generations", "0")
    assert refused.returncode == 1 and "differ only in case" in refused.stderr and "--label NAME" in refused.stderr
    _, out = evopool("run", str(data), "--workdir", str(tmp_path / "b"), "--generations", "0", "--label", "none",
                     "--label", "inhibitor", "--label", "Inhibitor", "--label", "activator")
    assert out.returncode == 0, out.stderr
    task = Store.open(tmp_path / "b").load_task()
    Store.close_all()
    assert task.labels == ("none", "inhibitor", "Inhibitor", "activator")  # as given: order, case, a class to come


def test_run_with_other_data_on_a_workspace_that_holds_data_is_refused(tmp_path, demo_csv):
    """Only an empty workspace imports DATA: a rerun with the same file goes on, another file is refused (it used to be
    ignored without a word, the old rows evolved as if they were the new)."""
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    _, again = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert again.returncode == 0, again.stderr
    other = tmp_path / "other.csv"
    other.write_bytes(demo_csv.read_bytes())
    for data in (str(other), str(tmp_path / "missing.csv")):
        _, refused = evopool("run", data, "--workdir", ws, "--generations", "0")
        assert refused.returncode == 2 and "already holds data" in refused.stderr and data in refused.stderr
    assert Store.open(ws).count_examples() == 2056  # nothing imported, nothing lost
    Store.close_all()


def test_describe_sets_replaces_prints_and_removes_a_labels_description_after_import(tmp_path, demo_csv):
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    listed, out = evopool("describe", "SPAM", "links and channel plugs", "--workdir", ws)
    assert out.returncode == 0, out.stderr
    assert listed == {"labels": {"SPAM": "links and channel plugs"}, "previous": ""}
    changed, out = evopool("describe", "SPAM", "requests to subscribe", "--workdir", ws)
    assert changed["previous"] == "links and channel plugs" and "(was: links and channel plugs)" in out.stderr
    listed, _ = evopool("describe", "--workdir", ws)
    assert listed == {"labels": {"HAM": "", "SPAM": "requests to subscribe"}}
    one, _ = evopool("describe", "SPAM", "--workdir", ws)  # a label alone only prints
    assert one == {"labels": {"SPAM": "requests to subscribe"}}
    for args in (["SPAM", ""], ["SPAM", "x", "--remove"], ["--remove"], ["EGGS", "x"], ["EGGS"]):
        _, out = evopool("describe", *args, "--workdir", ws)
        assert out.returncode == 2, (args, out.stderr)
    assert "unknown label 'EGGS'; the labels are HAM, SPAM" in out.stderr
    assert "use --remove" in evopool("describe", "SPAM", " ", "--workdir", ws)[1].stderr
    removed, out = evopool("describe", "SPAM", "--remove", "--workdir", ws)
    assert removed == {"labels": {"SPAM": ""}, "previous": "requests to subscribe"} and "SPAM: removed" in out.stderr
    Store.close_all()
    assert not Store.open(Path(ws)).load_task().label_descriptions


def test_bad_input_is_a_one_line_domain_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text,label\n1,hello,a\n1,again,b\n")
    _, out = evopool("run", str(bad), "--workdir", str(tmp_path / "ws"))
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "row 2: duplicate id '1'" in line and "Traceback" not in out.stderr


def test_an_import_refused_for_its_label_column_or_dev_size_says_which_and_why(tmp_path):
    """Both were told as "row 0: need at least two labels, found []" or "no labeled rows, so there is no dev split"."""
    data = tmp_path / "d.csv"
    data.write_text("id,text,Label\n" + "".join(f"r{i},some words {i},{'ab'[i % 2]}\n" for i in range(10)))
    _, out = evopool("run", str(data), "--workdir", str(tmp_path / "a"), "--generations", "0")
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: no label column 'label' in the file (its columns: 'id', 'text', 'Label'; column names are "
        "case-sensitive: is it 'Label'?); name the column that holds the labels")
    _, out = evopool("run", str(data), "--workdir", str(tmp_path / "b"), "--generations", "0", "--label-column",
                     "Label", "--dev-size", "0")
    assert out.returncode == 1 and "the file: dev size 0: none of the 10 labeled rows goes to dev" in out.stderr


def test_a_workspace_without_data_is_a_domain_error_for_eval_export_and_pool(tmp_path):
    ws = str(tmp_path / "empty")
    Store.open(ws)  # a workspace with no rows (a studio's new one): closed again for the subprocesses to open
    Store.close_all()
    for command in (["eval"], ["export", "--out", str(tmp_path / "x.csv")], ["pool"]):
        _, out = evopool(*command, "--workdir", ws)
        assert out.returncode == 1, (command, out.stderr)
        assert out.stderr.strip().splitlines() == [f"error: the workspace {ws} holds no data: import it with "
                                                   f"`evopool run DATA --workdir {ws}`"]


def test_usage_errors_exit_2_with_the_usage(tmp_path):
    ws = str(tmp_path / "ws")
    for args in (["eval", "--workdir", ws, "--aggregator", "best"], ["run", "--workdir", ws, "--agents", "gpt"],
                 ["frobnicate"], ["run", "--workdir", ws]):
        _, out = evopool(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("usage: evopool") and "Traceback" not in out.stderr
    # the last one: a new workspace needs DATA, which only the workspace's state shows; none is left behind
    assert "evopool run: error: the workspace is empty: give DATA to import" in out.stderr
    assert not (tmp_path / "ws").exists()


def test_version_is_the_package_version():
    _, out = evopool("--version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.returncode == 0 and out.stdout.strip() == f"evopool {version}"


def test_choices_come_from_the_registries_and_the_default_aggregator_is_the_studios():
    parser = build_parser()
    for name in AGGREGATORS:
        assert parser.parse_args(["eval", "--workdir", "w", "--aggregator", name]).aggregator == name
    for name in EMBEDDERS:
        assert parser.parse_args(["export", "--workdir", "w", "--out", "o", "--embedder", name]).embedder == name
    for name in AGENT_CHOICES:
        assert parser.parse_args(["run", "--workdir", "w", "--agents", name]).agents == name
    studio_default = inspect.signature(start_labels).parameters["aggregator"].default
    assert parser.parse_args(["eval", "--workdir", "w"]).aggregator == studio_default == DEFAULT_AGGREGATOR
    assert parser.parse_args(["export", "--workdir", "w", "--out", "o"]).aggregator == studio_default


def _pool_add(capsys, *args: str) -> tuple[int, dict]:
    from engine.cli import main

    code = main(["pool", "add", *args])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def main_stderr(capsys, *args: str) -> tuple[int, str]:
    """`evopool ARGS` in process: its exit code and the last line it printed on stderr."""
    from engine.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_pool_add_submits_an_expert_file_like_the_editor(tmp_path, demo_csv, capsys):
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    good = tmp_path / "free_prize.py"
    good.write_text('import re\n\ndef annotate(example):\n    """Free prize spam"""\n    return "SPAM" if '
                    're.search(r"\\b(free|prize|subscribe)\\b", example["text"], re.I) else None\n')
    code, result = _pool_add(capsys, str(good), "--workdir", ws, "--name", "free prize")
    assert code == 0 and result["added"] and result["verdict"] == "accept" and not result["approved_over_gate"]
    assert result["name"] == "free prize" and result["fires"] > 0 and result["pool_size"] == 1
    # the same code again is a member, not a newcomer: it had "joined" (pool size unchanged) and been locked
    code, again = _pool_add(capsys, str(good), "--workdir", ws, "--name", "another name")
    assert code == 1 and not again["added"] and again["verdict"] == "in pool" and again["pool_size"] == 1
    assert again["name"] == "free prize" and "already in the pool as free prize" in again["reasons"][0]
    shaped = tmp_path / "shaped.json"
    shaped.write_text("[1, 2]")  # valid JSON, not gate settings: an error line naming the file, no traceback
    assert main_stderr(capsys, "pool", "add", str(good), "--workdir", ws, "--gate-config", str(shaped)) == (
        1, f"error: {shaped}: gate settings are an object of setting: number, not list")

    weak = tmp_path / "weak.py"
    weak.write_text('def annotate(example):\n    return "HAM" if len(example["text"]) % 7 == 0 else None\n')
    strict = tmp_path / "gate.json"
    strict.write_text('{"min_precision_other": 0.99}')
    code, result = _pool_add(capsys, str(weak), "--workdir", ws, "--gate-config", str(strict))
    assert code == 1 and not result["added"] and result["verdict"] == "reject"
    assert any("precision" in reason for reason in result["reasons"]) and result["pool_size"] == 1
    code, result = _pool_add(capsys, str(weak), "--workdir", ws, "--gate-config", str(strict), "--approve")
    assert code == 0 and result["added"] and result["approved_over_gate"] and result["pool_size"] == 2

    refused = tmp_path / "shell.py"
    refused.write_text('import os\n\ndef annotate(example):\n    return os.system("id")\n')
    code, result = _pool_add(capsys, str(refused), "--workdir", ws)
    assert code == 1 and result["verdict"] == "refused" and "'os'" in result["reasons"][0]

    store = Store.open(ws)  # the same handle main() used (one per workspace per process)
    members = store.annotators(store.pool_ids())
    assert sorted(a.name for a in members) == sorted(["free prize", result_name(weak)])
    assert {a.author for a in members} == {"human"}
    latest = store.latest_verdicts()
    by_name = {a.name: latest[a.id] for a in members}
    # the gate's accept stays the gate's (not locked in); only the one added over the gate is the expert's approval
    assert by_name == {"free prize": ("accept", "gate"), result_name(weak): ("approve", "human")}


def result_name(path: Path) -> str:
    """The name make_annotator gives a file without --name or docstring: human-<first six of its id>."""
    from engine.domain import Candidate
    from engine.sandbox.annotators import make_annotator

    return make_annotator(Candidate(path.read_text(), "human"), 0, author="human").name


def test_eval_on_test_when_every_labeled_row_went_to_dev_says_so(tmp_path, demo_csv):
    frame = pd.read_csv(demo_csv, keep_default_na=False)
    labeled = frame[frame["label"] != ""].head(40)
    small = pd.concat([labeled, frame[frame["label"] == ""].head(200)])[["id", "text", "label"]]
    data = tmp_path / "small.csv"
    small.to_csv(data, index=False)  # 40 labeled rows, no split column: all 40 go to dev (fewer than its size)
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(data), "--workdir", ws, "--generations", "1")
    assert out.returncode == 0, out.stderr
    result, out = evopool("eval", "--workdir", ws, "--aggregator", "mv")  # --split test by default
    assert out.returncode == 1 and result is None, out.stdout  # was exit 0 with "coverage": NaN
    assert out.stderr.strip().splitlines() == ["error: the workspace has no test rows to score: every labeled row "
                                               "went to dev; import more labeled rows, or score dev (--split dev)"]
    result, out = evopool("eval", "--workdir", ws, "--aggregator", "mv", "--split", "dev")
    assert out.returncode == 0 and result["n"] == 40, out.stderr


def test_pool_add_weighs_the_pool_sample_evidence_a_generation_weighs(tmp_path, demo_csv, monkeypatch):
    import engine.expert.review as review
    from engine.agents.offline.proposer import OfflineProposer
    from engine.apply.executor import CompiledExecutor
    from engine.evolve import EvolveConfig, evolve
    from engine.ingest.importer import import_path

    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv)
    seen = {}
    real = review.pool_evidence

    def says_it_is_mostly_wrong(executor, context, fresh):  # the evidence a generation would pass, then its verdict
        seen["evidence"] = real(executor, context, fresh)
        seen["sample"], seen["seed"] = len(context.pool_sample), context.seed
        return {a.id: (0.05, 1000.0) for a in fresh}

    with CompiledExecutor() as executor:  # the workspace's runs use seed 7: so does the sample pool add draws
        evolve(store, OfflineProposer(), executor, 1, EvolveConfig(seed=7))

    monkeypatch.setattr(review, "pool_evidence", says_it_is_mostly_wrong)
    source = ('import re\n\ndef annotate(example):\n    return "SPAM" if re.search(r"\\bsubscribe\\b", '
              'example["text"], re.I) else None\n')
    with CompiledExecutor() as executor:
        result = review.submit(store, executor, source, name="subscribe")
    assert seen["sample"] > 0 and seen["seed"] == 7  # the pool sample the next generation would draw
    assert result["verdict"] == "reject" and not result["added"]  # accepted on dev alone before
    assert any("on the unlabeled sample" in reason for reason in result["reasons"]), result["reasons"]


def test_pool_add_of_a_members_replacement_retires_the_member_the_gate_prunes(tmp_path, demo_csv):
    """The gate judges a newcomer with the member it covers gone (no near-copy, its own contribution): accepted,
    that member must leave, or the pool holds both and scores below what the gate weighed (0.971 -> 0.946)."""
    from demo_ideas import WIDER_CAPS

    from engine.agents.offline.proposer import OfflineProposer
    from engine.apply.executor import CompiledExecutor
    from engine.evolve import current_dev_macro_f1, evolve
    from engine.expert import review
    from engine.ingest.importer import import_path

    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv)
    with CompiledExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 2)
        result = review.submit(store, executor, WIDER_CAPS, name="wider")
    assert result["added"] and result["verdict"] == "accept" and result["pruned"], result
    pool = store.pool_ids()
    assert result["id"] in pool and not set(result["pruned"]) & set(pool)
    latest = store.latest_verdicts()
    assert all(latest[member] == ("prune", "gate") for member in result["pruned"])
    # the gate's verdict, with its reasons, not the expert's approval that would lock it in (a browser walk)
    assert latest[result["id"]] == ("accept", "gate") and result["id"] not in store.human_locked()
    assert any(r.startswith("viable") for r in store.verdicts(result["id"])["reasons"].iloc[-1])
    assert result["pool_size"] == len(pool)
    assert current_dev_macro_f1(store) == pytest.approx(result["dev_macro_f1"], abs=1e-4)


def test_a_run_with_model_code_names_the_sandbox_layers_this_machine_lacks(capsys):
    from engine.cli.commands import _warn_weak_sandbox

    class Machine:  # what a machine without Landlock and cgroups reports
        def containment(self):
            return {"uid": "on: nobody", "landlock": "off: kernel too old", "cgroup": "off: not root",
                    "seccomp": "on: 70 system calls refused"}

    _warn_weak_sandbox(Machine())
    assert capsys.readouterr().err.startswith("sandbox: layers off on this machine: landlock (off: kernel too old), "
                                              "cgroup (off: not root) (")
    with SandboxExecutor(workers=1) as executor:  # this machine: every layer on, so nothing is said
        _warn_weak_sandbox(executor)
        everything_on = all(v.startswith("on") for v in executor.containment().values())
    assert (capsys.readouterr().err == "") == everything_on


def test_a_mistyped_or_damaged_workdir_is_an_error_that_leaves_nothing_behind(tmp_path, capsys):
    """A read-only command on a folder with no workspace had created one (an empty, migrated DuckDB file); a
    damaged file had been reported as "in use by another process"; a `run` whose first import failed had left an
    empty workspace."""
    nowhere = tmp_path / "typo"
    code, line = main_stderr(capsys, "eval", "--workdir", str(nowhere))
    assert code == 1 and line.startswith(f"error: there is no workspace in {nowhere}") and not nowhere.exists()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "workspace.duckdb").write_text("garbage")
    code, line = main_stderr(capsys, "pool", "--workdir", str(damaged))
    assert code == 1 and "damaged or not a workspace" in line and "in use" not in line
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\n,\n")
    code, line = main_stderr(capsys, "run", str(bad), "--workdir", str(tmp_path / "fresh"), "--generations", "0")
    assert code == 1 and line.startswith("error:") and not (tmp_path / "fresh").exists()


def test_eval_on_an_empty_pool_says_its_labels_read_no_votes(tmp_path, demo_csv):
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    result, out = evopool("eval", "--workdir", ws, "--split", "test", "--aggregator", "auto")
    assert out.returncode == 0, out.stderr
    assert result["pool_size"] == 0 and result["uses_pool"] is False
    assert result["pool_majority_vote"] is None  # the pool's own figure: absent, not a zero
    assert "read no votes" in result["note"]
    assert result["judged_on"] == "dev" and result["interval"][0] <= result["estimate"] <= result["interval"][1]
