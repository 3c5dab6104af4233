"""Multi-label tasks end to end: import label sets, score votes against them, evolve, label, export, CLI.

Real parts throughout: a DuckDB file, sandbox worker processes, the offline agents, MiniLM embeddings.
The data is built here: short sentences whose words clearly cue one or two of three topics.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from engine.agents.offline.proposer import OfflineProposer
from engine.apply.votes import ensure_votes
from engine.domain import AUDIT, FITNESS
from engine.evolve import current_dev_macro_f1, evolve
from engine.export.files import pool_as_python, write_export
from engine.ingest.errors import IngestError
from engine.ingest.importer import IngestOptions, import_path
from engine.labeling.evaluate import evaluate
from engine.labeling.fit import fit_and_predict, soft_labels
from engine.metrics.score import exact_match, multilabel_f1, pool_macro_f1, score_annotator
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store

LABELS = ("politics", "sports", "tech")
CUES = {
    "sports": ["football", "goal", "league", "coach", "stadium", "tennis"],
    "politics": ["election", "senate", "minister", "parliament", "ballot", "policy"],
    "tech": ["software", "laptop", "startup", "robot", "chip", "smartphone"],
}
SETS = [["sports"], ["politics"], ["tech"], ["sports", "politics"], ["politics", "tech"], ["tech", "sports"]]
FILLER = ["news today", "people talked about it", "a long story", "read more below", "what a week"]


def rows(n: int, seed: int) -> list[tuple[str, list[str]]]:
    """n (text, label set) pairs; each label of the set puts two of its cue words in the text."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        labels = SETS[i % len(SETS)]
        words = [w for lab in labels for w in rng.choice(CUES[lab], 2, replace=False)]
        out.append((f"{' and '.join(words)}: {FILLER[i % len(FILLER)]}", labels))
    return out


def write_csv(path, sep: str = "|", sizes=(("dev", 48), ("test", 30), ("pool", 42))) -> None:
    records = []
    for split, n in sizes:
        for j, (text, labels) in enumerate(rows(n, seed=len(records))):
            records.append({"id": f"{split}-{j}", "text": text, "label": sep.join(labels) if split != "pool" else "",
                            "split": split})
    pd.DataFrame.from_records(records).to_csv(path, index=False)


@pytest.fixture(scope="module")
def executor():
    with SandboxExecutor(workers=2) as ex:
        yield ex


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "topics.csv"
    write_csv(path)
    return path


@pytest.fixture(scope="module")
def evolved_dir(tmp_path_factory, csv_path, executor):
    """The topics CSV imported as multi-label, after two generations of the offline agents."""
    workdir = tmp_path_factory.mktemp("ws") / "ws"
    evolve(_imported(workdir, csv_path), OfflineProposer(), executor, 2)
    return workdir


def _imported(workdir, csv_path) -> Store:
    store = Store.open(workdir)
    import_path(store, csv_path, IngestOptions(multi_label=True))
    return store


@pytest.fixture
def evolved(evolved_dir) -> Store:
    return Store.open(evolved_dir)  # reopened per test: other fixtures may close every connection


# ---- ingest and store ------------------------------------------------------------------------------------
def test_label_sets_are_imported_and_kept(evolved):
    store = evolved
    task = store.load_task()
    assert task.multi_label and task.labels == LABELS
    assert store.split_counts() == {"dev": 48, "pool": 42, "test": 30}
    dev = store.examples_frame("dev")
    Y = store.label_matrix("dev")
    assert Y.shape == (48, 3) and set(np.unique(Y)) == {0, 1} and (Y.sum(axis=1) >= 1).all()
    # row 3 of dev is "sports|politics": both in the set, the first one is its `label`
    assert dev["label_set"].iloc[3] == (0, 1) and list(Y[3]) == [1, 1, 0]
    assert store.label_indices("dev")[3] == LABELS.index("sports")
    assert store.examples("dev")[3].label == LABELS.index("sports")
    # the pseudo-splits partition dev; the pool's rows are unlabeled (all zero)
    assert len(store.label_matrix(FITNESS)) + len(store.label_matrix(AUDIT)) == 48
    assert not store.label_matrix("pool").any()
    assert (store.gold(FITNESS) == store.label_matrix(FITNESS)).all()


def test_unknown_label_in_a_cell_is_named_per_row(tmp_path):
    store = Store.open(tmp_path / "ws")
    path = tmp_path / "bad.csv"
    path.write_text("id,text,label,split\n"
                    "1,football goal,sports,dev\n"
                    "2,election and chip,politics|tech,dev\n"
                    "3,cake recipe,sports|cooking,dev\n"
                    "4,robot ballot,tech|baking|knitting,test\n"
                    "5,no label here,,dev\n"
                    "6,senate news,politics,pool\n")
    opts = IngestOptions(multi_label=True, labels=LABELS)
    with pytest.raises(IngestError) as caught:
        import_path(store, path, opts)
    problems = {p.row: p.reason for p in caught.value.problems}
    assert set(problems) == {3, 4, 5}
    assert problems[3] == "label 'cooking' is not in the label set (politics, sports, tech)"
    assert problems[4] == "labels 'baking', 'knitting' are not in the label set (politics, sports, tech)"
    assert problems[5] == "a dev row needs a label"
    assert not store.has_data()
    # the good rows go in when asked, with their label sets
    report = import_path(store, path, IngestOptions(multi_label=True, labels=LABELS, skip_bad_rows=True,
                                                    audit_fraction=0))
    assert report.n_rows == 3 and len(report.skipped) == 3
    assert store.label_matrix("dev").tolist() == [[0, 1, 0], [1, 0, 1]]


def test_audit_rows_keep_their_label_sets_and_are_scored_apart(tmp_path, executor):
    data = tmp_path / "big.csv"
    write_csv(data, sizes=(("dev", 300), ("test", 6)))  # enough dev rows for audit rows to be held back
    store = Store.open(tmp_path / "ws")
    import_path(store, data, IngestOptions(multi_label=True))
    fitness, audit = store.label_matrix(FITNESS), store.label_matrix(AUDIT)
    assert len(fitness) + len(audit) == 300 and len(audit) > 0
    assert (audit.sum(axis=1) >= 1).all() and (audit.sum(axis=1) == 2).any()
    dev_ids = store.example_ids("dev")
    rows = [dev_ids.index(e) for e in store.example_ids(AUDIT)]
    assert (store.label_matrix("dev")[rows] == audit).all()
    # no pool yet: the text-only model labels dev; its audit figure is reported on the audit rows
    result = fit_and_predict(store, executor, "embedding", ("dev",))
    assert result.dev_scores.n_audit == len(audit) and 0 <= result.dev_scores.audit_macro_f1 <= 1


def test_jsonl_list_cells_and_single_label_rows(tmp_path):
    path = tmp_path / "topics.jsonl"
    lines = [{"text": "goal", "label": ["sports"], "split": "dev"},
             {"text": "chip vote", "label": ["tech", "politics"], "split": "dev"},
             {"text": "senate", "label": "politics", "split": "test"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    store = Store.open(tmp_path / "ws")
    import_path(store, path, IngestOptions(multi_label=True, audit_fraction=0))
    assert store.load_task().labels == LABELS
    assert store.label_matrix("dev").tolist() == [[0, 1, 0], [1, 0, 1]]
    assert store.label_indices("dev").tolist() == [1, 2]  # the first label as written
    # a single-label workspace keeps no label sets; its label matrix is one-hot
    single = Store.open(tmp_path / "single")
    csv = tmp_path / "single.csv"
    csv.write_text("text,label,split\nfootball,sports,dev\nsenate,politics,dev\n")
    import_path(single, csv, IngestOptions(audit_fraction=0))
    assert not single.load_task().multi_label
    assert single.examples_frame("dev")["label_set"].isna().all()
    assert single.label_matrix("dev").tolist() == [[0, 1], [1, 0]]
    assert (single.gold("dev") == single.label_indices("dev")).all()


# ---- fitness --------------------------------------------------------------------------------------------
# label sets of four rows: {politics, sports}, {politics, sports}, {tech}, {tech}
Y4 = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1]])


def test_a_vote_is_correct_when_its_label_is_in_the_set():
    votes = np.array([1, 0, 1, -1])  # sports on row 0 (in the set), politics on row 1 (in), sports on row 2 (not)
    s = score_annotator("a", votes, Y4)
    assert (s.fires, s.correct, s.label) == (3, 2, 1)
    assert s.precision == pytest.approx(2 / 3) and s.coverage == pytest.approx(3 / 4)
    # against first labels only (sports, sports, tech, tech) the politics vote on row 1 would be wrong
    first = score_annotator("a", votes, np.array([1, 1, 2, 2]))
    assert (first.fires, first.correct) == (3, 1)


def test_pool_macro_f1_predicts_every_class_some_annotator_voted():
    votes = np.array([[0, 1], [-1, 1], [2, -1], [0, -1]])  # predicted sets: {0,1}, {1}, {2}, {0}
    # class 0: gold rows {0,1}, predicted {0,3}: F1 2*1/(2+2) = 0.5; class 1: {0,1} vs {0,1}: 1.0;
    # class 2: {2,3} vs {2}: 2*1/(2+1) = 2/3; macro (0.5 + 1 + 2/3) / 3
    assert pool_macro_f1(votes, Y4, 3) == pytest.approx((0.5 + 1 + 2 / 3) / 3)
    P = np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
    macro, micro = multilabel_f1(Y4, P)
    assert micro == pytest.approx(2 * 4 / (6 + 5)) and macro == pytest.approx((0.5 + 1 + 2 / 3) / 3)
    assert exact_match(Y4, P) == 0.5
    assert pool_macro_f1(votes[:, :0], Y4, 3) == 0.0  # an empty pool predicts nothing


def test_generations_score_annotators_against_label_sets(evolved):
    store = evolved
    assert store.last_complete_generation() == 2
    pool = store.pool_ids()
    assert pool, "the offline agents should find the topic cue words"
    Y = store.label_matrix(FITNESS)
    votes = store.vote_matrix(pool, FITNESS).votes
    scores = store.scores(pool)
    first = store.label_indices(FITNESS)
    set_only = 0
    for j, annotator_id in enumerate(pool):
        fired = votes[:, j] != -1
        correct = int(Y[np.flatnonzero(fired), votes[fired, j]].sum())
        assert scores[annotator_id].correct == correct and scores[annotator_id].fires == int(fired.sum())
        set_only += correct - int((votes[fired, j] == first[fired]).sum())
    assert set_only > 0  # some votes are right only because the label is the row's second one
    after = store.generations()["dev_macro_f1_after"].iloc[-1]
    assert current_dev_macro_f1(store) == pytest.approx(after) == pytest.approx(pool_macro_f1(votes, Y, 3))
    assert after > 0.5


# ---- labeling and export -------------------------------------------------------------------------------
def test_vote_only_aggregators_refuse_a_multi_label_task(evolved, executor):
    with pytest.raises(ValueError, match="'evoagg', 'auto' or 'auto-pool'"):
        fit_and_predict(evolved, executor, "mv", ("dev",))


def test_evaluate_reports_multi_label_figures(evolved, executor):
    store = evolved
    result = evaluate(store, executor, "test", "evoagg")
    assert result["multi_label"] is True and result["threshold"] == 0.5 and result["n"] == 30
    assert {"macro_f1", "micro_f1", "exact_match", "coverage", "labeled"} <= set(result)
    # the same figures, recomputed from the labels and the test label sets
    labeled = fit_and_predict(store, executor, "evoagg", ("dev", "test"), score_dev=False)
    test = [labeled.soft.example_ids.index(e) for e in store.example_ids("test")]
    macro, micro = multilabel_f1(store.label_matrix("test"), labeled.hard[test])
    assert result["macro_f1"] == round(macro, 4) and result["micro_f1"] == round(micro, 4)
    assert result["macro_f1"] > 0.8  # the cue words are unmistakable
    # a stricter threshold can only predict fewer classes
    strict = fit_and_predict(store, executor, "auto", ("dev", "test"), score_dev=False, threshold=0.9)
    assert strict.hard.sum() <= labeled.hard.sum() and strict.threshold == 0.9


def test_soft_labels_and_export(evolved, executor, tmp_path):
    store = evolved
    result = soft_labels(store, executor, "evoagg")
    assert result.hard.shape == (120, 3) and result.threshold == 0.5
    dev = [result.soft.example_ids.index(e) for e in store.example_ids("dev")]
    assert np.allclose(result.soft.probs[dev], result.dev_oof_probs)  # dev rows are out-of-fold
    assert {"macro_f1", "micro_f1", "exact_match", "n"} <= set(result.dev_scores.to_dict())
    path, manifest_path = write_export(store, result.soft, result.hard, result.n_votes, tmp_path / "out.csv",
                                       threshold=result.threshold)
    frame = pd.read_csv(path, keep_default_na=False)
    assert len(frame) == 120 and "label" not in frame
    assert {"id", "text", "split", "labels", "confidence", "p_politics", "p_sports", "p_tech", "n_votes"} <= set(
        frame.columns)
    p = frame[["p_politics", "p_sports", "p_tech"]].to_numpy()
    expected = ["|".join(LABELS[c] for c in range(3) if row[c] >= 0.5) for row in p]
    assert frame["labels"].tolist() == expected
    assert (frame["labels"].str.count(r"\|") >= 1).any()  # some rows carry two labels
    manifest = json.loads(manifest_path.read_text())
    assert manifest["multi_label"] is True and manifest["threshold"] == 0.5 and manifest["label_separator"] == "|"


# ---- the CLI ------------------------------------------------------------------------------------------
def evopool(*args: str) -> tuple[dict | None, subprocess.CompletedProcess]:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else None), out


def test_cli_multi_label_run_eval_export(tmp_path):
    data = tmp_path / "topics.csv"
    write_csv(data, sep=";")
    ws = str(tmp_path / "ws")
    summary, out = evopool("run", str(data), "--workdir", ws, "--generations", "1", "--multi-label",
                           "--label-separator", ";")
    assert out.returncode == 0, out.stderr
    assert summary["generation"] == 1 and summary["pool_size"] > 0

    result, out = evopool("eval", "--workdir", ws, "--split", "test")
    assert out.returncode == 0, out.stderr
    # the default is the studio's aggregator, auto, which labels a multi-label task with its multi-label EvoAgg
    assert result["multi_label"] is True and result["aggregator"] == "auto" and result["n"] == 30
    assert 0.0 < result["macro_f1"] <= 1.0 and 0.0 <= result["exact_match"] <= 1.0 and "micro_f1" in result

    _, out = evopool("eval", "--workdir", ws, "--aggregator", "mv")
    assert out.returncode == 1 and "multi-label" in out.stderr and "Traceback" not in out.stderr  # a domain error

    csv = tmp_path / "labels.csv"
    result, out = evopool("export", "--workdir", ws, "--out", str(csv), "--threshold", "0.4")
    assert out.returncode == 0, out.stderr
    frame = pd.read_csv(csv, keep_default_na=False)
    assert len(frame) == result["rows"] == 120
    p = frame[["p_politics", "p_sports", "p_tech"]].to_numpy()
    assert frame["labels"].tolist() == [";".join(LABELS[c] for c in range(3) if row[c] >= 0.4) for row in p]
    manifest = json.loads((tmp_path / "labels.csv.manifest.json").read_text())
    assert manifest["multi_label"] is True and manifest["threshold"] == 0.4


def test_the_pool_as_python_writes_label_sets(evolved, executor, tmp_path):
    store = evolved
    pool = store.pool_ids()
    ensure_votes(store, executor, pool, "test")
    path = tmp_path / "pool.py"
    path.write_text(pool_as_python(store))
    rows = store.examples_frame("test")
    stdin = "\n".join(json.dumps({**f, "text": t}) for f, t in zip(rows["fields"], rows["text"], strict=True))
    out = subprocess.run([sys.executable, str(path)], input=stdin, capture_output=True, text=True, check=True,
                         timeout=120)
    written = [json.loads(line)["labels"] for line in out.stdout.splitlines()]
    # the script's label sets are the labels the sandboxed pool voted on each row, in label-set order
    names = store.load_task().labels
    votes = store.vote_matrix(pool, example_ids=list(rows["id"])).votes
    assert written == [[names[c] for c in sorted(set(row.tolist()) - {-1})] for row in votes]
    assert any(len(labels) > 1 for labels in written)


def test_offline_mining_counts_a_cue_right_when_its_class_is_in_the_set():
    from engine.agents.offline.candidates import build_workspace, cue_proposals
    from engine.domain import Task

    task = Task("t", ("politics", "sports", "tech"))
    # "stadium" rows are politics first and sports second: right for sports only through the label set
    texts = [f"new stadium vote number {i}" for i in range(6)] + [f"chip launch {i}" for i in range(6)]
    first = np.array([0] * 6 + [2] * 6)
    sets = np.zeros((12, 3), dtype=np.int64)
    sets[:6, 0] = sets[:6, 1] = 1
    sets[6:, 2] = 1
    inputs = [{"text": t} for t in texts]

    def sports_cues(label_sets):
        ws = build_workspace(task, inputs, first, [], ("sentence",), label_sets)
        return {p.spec.cues for p in cue_proposals(ws, min_fires=5) if p.label == 1}

    assert ("stadium",) in sports_cues(sets)
    assert not sports_cues(None)  # by first labels alone, no row is sports
    ws = build_workspace(task, inputs, first, [], ("sentence",), sets)
    assert ws.hit(1).sum() == 6 and ws.hit(0).sum() == 6  # a row counts for each of its labels


def test_a_corpus_is_labeled_with_label_sets_as_the_export_labels_the_workspace(evolved, executor, tmp_path):
    """The corpus engine on a multi-label task: a `labels` column joined by the separator, the export's values."""
    from engine.corpus.engines import label_corpus
    from engine.corpus.labeler import fit_labeler
    from engine.corpus.reading import survey
    from engine.corpus.shards import read_output
    from engine.export.files import labeled_frame

    labeler = fit_labeler(evolved, executor, "auto")
    result = soft_labels(evolved, executor, "auto")
    pool = labeled_frame(evolved, result.soft, result.hard, result.n_votes).query("split == 'pool'")
    corpus = tmp_path / "pool.jsonl"
    pool[["id", "text"]].to_json(corpus, orient="records", lines=True)
    label_corpus(labeler, survey([corpus]), tmp_path / "out", batch_size=16)
    labeled = read_output(tmp_path / "out")
    assert "labels" in labeled.columns and "label" not in labeled.columns
    assert labeled["aggregator"].iloc[0] == "auto:evoagg" and any("|" in cell for cell in labeled["labels"])
    assert list(labeled["id"]) == list(pool["id"])
    assert list(labeled["labels"]) == list(pool["labels"])
