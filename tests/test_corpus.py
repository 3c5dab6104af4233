"""`evopool label` on the local engine: shards and manifest, stable ids, bad input named, runs never mixed, and
a run killed mid-way (SIGKILL, real process) leaving only complete shards that a rerun resumes from."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.corpus.engines import label_corpus
from engine.corpus.labeler import dev_digest, fit_labeler
from engine.corpus.reading import CorpusError, find_files, iter_batches, survey
from engine.corpus.shards import MANIFEST, OutputError, read_output
from engine.export.files import labeled_frame
from engine.jobs import JobRegistry, start_corpus_label
from engine.labeling.fit import soft_labels
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The demo after two offline generations (a real pool of ~20 annotators)."""
    ws = tmp_path_factory.mktemp("corpus") / "ws"
    assert main(["run", str(ROOT / "data/demo/youtube_spam.csv"), "--workdir", str(ws), "--generations", "2"]) == 0
    Store.close_all()
    return ws


@pytest.fixture(scope="module")
def wmv_labeler(workspace):
    with SandboxExecutor() as executor:
        labeler = fit_labeler(Store.open(workspace), executor, "wmv")
    Store.close_all()
    return labeler


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """A JSON Lines corpus of `rows`, one object per line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _corpus(tmp_path: Path, rows: int | None = None) -> Path:
    """The demo's text as a Parquet corpus without an id column (the ids must come from file and row)."""
    frame = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str)[["text"]]
    if rows:
        frame = frame.head(rows)
    path = tmp_path / "corpus.parquet"
    frame.to_parquet(path, index=False)
    return path


def exported_pool(store: Store, result, corpus: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`export`'s frame of these soft labels, and its pool rows, whose ids and texts are written to `corpus` (JSONL)
    for the corpus labeler to label again."""
    exported = labeled_frame(store, result.soft, result.hard, result.n_votes)
    Store.close_all()
    pool_rows = exported[exported["split"] == "pool"].reset_index(drop=True)
    pool_rows[["id", "text"]].to_json(corpus, orient="records", lines=True, force_ascii=False)
    return exported, pool_rows


def test_labels_equal_the_workspace_export_on_the_same_rows(workspace, wmv_labeler, tmp_path):
    """The same pool and the same dev-fitted aggregator give the corpus rows the labels `export` gives them."""
    store = Store.open(workspace)
    with SandboxExecutor() as executor:
        result = soft_labels(store, executor, "wmv")
    corpus = tmp_path / "pool.jsonl"
    exported, pool_rows = exported_pool(store, result, corpus)
    manifest = label_corpus(wmv_labeler, survey(find_files(corpus)), tmp_path / "out", batch_size=300)
    labeled = read_output(tmp_path / "out")
    assert manifest["rows"] == len(pool_rows) == len(labeled) and manifest["shards"] == -(-len(pool_rows) // 300)
    assert list(labeled["id"]) == list(pool_rows["id"])
    columns = ["label", "confidence", *[c for c in exported.columns if c.startswith("p_")], "n_votes", "aggregator"]
    pd.testing.assert_frame_equal(labeled[columns], pool_rows[columns], check_dtype=False)
    assert set(labeled.columns) >= {"id", "text", "source_file", "source_row"}


def test_ids_come_from_file_and_row_without_an_id_column(wmv_labeler, tmp_path):
    (tmp_path / "in").mkdir()
    _corpus(tmp_path / "in", rows=250).rename(tmp_path / "in" / "a.parquet")
    pd.DataFrame({"text": ["subscribe to my channel", "nice song"]}).to_csv(tmp_path / "in" / "b.csv", index=False)
    files = survey(find_files(str(tmp_path / "in" / "*")))
    assert [f.rows for f in files] == [250, 2]
    out = label_corpus(wmv_labeler, files, tmp_path / "out", batch_size=100)
    labeled = read_output(tmp_path / "out")
    assert out["shards"] == 4 and len(labeled) == 252  # 100 + 100 + 50 from a.parquet, 2 from b.csv
    assert list(labeled["id"][:2]) == ["a.parquet:0", "a.parquet:1"] and labeled["id"].iloc[-1] == "b.csv:1"
    assert labeled["id"].is_unique
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert [s["first_row"] for s in manifest["shards"]] == [0, 100, 200, 0]
    assert manifest["labeler"]["made_by"] == "wmv" and manifest["labels"] == list(wmv_labeler.labels)
    # two files of one name in different folders (a partitioned dataset): each row's id names its folder too
    for day in ("day=01", "day=02"):
        (tmp_path / "parts" / day).mkdir(parents=True)
        pd.DataFrame({"text": ["subscribe to my channel", "nice song"]}).to_csv(tmp_path / "parts" / day / "part-0.csv",
                                                                              index=False)
    label_corpus(wmv_labeler, survey(find_files(str(tmp_path / "parts" / "*" / "*.csv"))), tmp_path / "out2")
    ids = read_output(tmp_path / "out2")["id"]
    assert list(ids) == ["day=01/part-0.csv:0", "day=01/part-0.csv:1", "day=02/part-0.csv:0", "day=02/part-0.csv:1"]


def test_a_named_id_column_gives_the_ids_and_a_resume_with_another_is_refused(wmv_labeler, tmp_path):
    """A corpus whose ids sit in `doc_id` came out as `<file>:<row>` ids, with no way to name the column (a browser
    walk); the CLI takes --id-column, the studio an Id column box, and a run is not resumed with another one."""
    pd.DataFrame({"doc_id": ["D-7", "D-9"], "text": ["subscribe to my channel", "nice song"]}).to_csv(
        tmp_path / "docs.csv", index=False)
    files = survey([tmp_path / "docs.csv"])
    labeler = dataclasses.replace(wmv_labeler, id_column="doc_id")
    label_corpus(labeler, files, tmp_path / "out")
    assert list(read_output(tmp_path / "out")["id"]) == ["D-7", "D-9"]
    with pytest.raises(OutputError):
        label_corpus(wmv_labeler, files, tmp_path / "out")  # the same output, ids from another column
    # a named id column the file lacks is an error, not row-number ids (a typo would give ids that join nothing)
    with pytest.raises(CorpusError, match="no id column 'docid'"):
        label_corpus(dataclasses.replace(wmv_labeler, id_column="docid"), files, tmp_path / "out3")


def test_a_parquet_corpus_indexed_by_id_keeps_its_ids(wmv_labeler, tmp_path):
    """pandas writes a named index as a column and reads it back as the index: it is data (the ids), not row
    numbers to drop."""
    frame = pd.DataFrame({"id": ["c7", "c9"], "text": ["subscribe to my channel", "nice song"]})
    frame.set_index("id").to_parquet(tmp_path / "indexed.parquet")
    label_corpus(wmv_labeler, survey([tmp_path / "indexed.parquet"]), tmp_path / "out")
    assert list(read_output(tmp_path / "out")["id"]) == ["c7", "c9"]


def test_missing_and_corrupt_inputs_are_named(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        find_files(tmp_path / "nope.parquet")
    with pytest.raises(CorpusError, match="no input file matches"):
        find_files(str(tmp_path / "*.parquet"))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(CorpusError, match="broken.parquet is not a readable parquet file"):
        survey([broken])
    bad_line = tmp_path / "rows.jsonl"
    bad_line.write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(CorpusError, match=r"rows.jsonl, line 2: not valid JSON"):
        list(iter_batches(survey([bad_line]), 10))


def test_a_cell_longer_than_csvs_default_limit_is_read(tmp_path, default_csv_limit):
    """A judgment of 200,000 characters ended the run ("field larger than field limit")."""
    judgment = "the court finds " * 12_500
    path = tmp_path / "long.csv"
    pd.DataFrame({"text": [judgment, "short text"]}).to_csv(path, index=False)
    assert [t for b in iter_batches(survey([path]), 10) for t in b.frame["text"]] == [judgment, "short text"]


def test_the_surveyed_rows_are_the_rows_read(tmp_path):
    """The progress total (and ETA) is the survey's count: a last line without its newline is a row, a blank line
    (which both readers skip: a CSV's used to fail the run at its end as a row of 0 cells) is not."""
    files = {"last.csv": "text\nsubscribe\nnice song", "last.jsonl": '{"text": "a"}\n{"text": "b"}',
             "blank.jsonl": '{"text": "a"}\n\n{"text": "b"}\n  \n{"text": "c"}\n\n',
             "blank.csv": "id,text\n1,a\n\n2,b\n3,c\n\n"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    surveyed = survey([tmp_path / name for name in files])
    assert [f.rows for f in surveyed] == [2, 2, 3, 3]
    assert [sum(len(b.frame) for b in iter_batches([f], 10)) for f in surveyed] == [2, 2, 3, 3]


def test_a_quote_that_swallows_the_rows_after_it_is_an_error_naming_its_line(tmp_path):
    """A quote left open in the last column took rows c4-c999 into row c3's text (4 rows labeled, exit 0); one
    closed by a later stray quote took the rows in between. Both name the line the quote opened on."""
    rows = [f"c{i},please subscribe number {i}" for i in range(1000)]
    tail = ["id,text", *rows]
    tail[4] = 'c3,"I love it'
    (tmp_path / "tail.csv").write_text("\n".join(tail) + "\n")
    stray = ["id,text", *rows]
    stray[6] = 'c5,"great song,really'
    stray[9] = 'c8,5" tall and more'
    (tmp_path / "stray.csv").write_text("\n".join(stray) + "\n")
    for name, said in (("tail.csv", "quote opened on line 5 .* runs to line 1001"),
                       ("stray.csv", "quote opened on line 7 .* runs to line 10")):
        files = survey([tmp_path / name])
        with pytest.raises(CorpusError, match=said):
            sum(len(b.frame) for b in iter_batches(files, 100))
    quoted = tmp_path / "quoted.tsv"  # a TSV's quotes are kept as written where they are no CSV quoting
    quoted.write_text('id\ttext\n1\t"Hello" he said\n2\t"a\tb"\n')
    assert [b.frame["text"].tolist() for b in iter_batches(survey([quoted]), 10)] == [['"Hello" he said', "a\tb"]]
    fine = tmp_path / "fine.csv"  # a cell quoted to hold a line break is one row
    fine.write_text('id,text\n1,"two\nlines"\n2,one line\n')
    assert [b.frame["text"].tolist() for b in iter_batches(survey([fine]), 10)] == [["two\nlines", "one line"]]


def test_cli_reports_a_corrupt_file_and_a_foreign_output_in_one_line(workspace, tmp_path, capsys):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"garbage")
    assert main(["label", "--workdir", str(workspace), "--input", str(broken), "--output", str(tmp_path / "o")]) == 1
    assert f"error: input file {broken} is not a readable parquet file" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    corpus = _corpus(tmp_path, rows=20)
    assert main(["label", "--workdir", str(workspace), "--input", str(corpus), "--output", str(tmp_path / "taken"),
                 "--aggregator", "mv"]) == 1
    assert "is not empty and holds no run record" in capsys.readouterr().err
    Store.close_all()


def test_a_different_run_into_the_same_output_is_refused(workspace, wmv_labeler, tmp_path):
    corpus = survey([_corpus(tmp_path, rows=50)])
    label_corpus(wmv_labeler, corpus, tmp_path / "out", batch_size=25)
    with pytest.raises(OutputError, match="holds another run"):
        label_corpus(wmv_labeler, corpus, tmp_path / "out", batch_size=10)  # other batches: other shards
    again = label_corpus(wmv_labeler, corpus, tmp_path / "out", batch_size=25)  # the same run: all done already
    assert again["resumed_shards"] == 2 and again["rows"] == 50
    with pytest.raises(OutputError, match="holds another run"):  # another threshold: other labels
        label_corpus(dataclasses.replace(wmv_labeler, threshold=0.9), corpus, tmp_path / "out", batch_size=25)


def test_a_rerun_fitted_with_another_seed_or_other_dev_labels_is_another_run(workspace, wmv_labeler, tmp_path):
    """The seed and dev's labels shape the fitted model: resuming a run fitted otherwise would mix two models' labels
    in one output, under a manifest naming only the second."""
    corpus = survey([_corpus(tmp_path, rows=50)])
    label_corpus(wmv_labeler, corpus, tmp_path / "out", batch_size=25)
    for change in ({"seed": 1}, {"dev_labels": "0" * 16}):
        refitted = dataclasses.replace(wmv_labeler, provenance={**wmv_labeler.provenance, **change})
        with pytest.raises(OutputError, match="holds another run"):
            label_corpus(refitted, corpus, tmp_path / "out", batch_size=25)
    dev = Store.open(workspace).examples_frame("dev")
    Store.close_all()
    assert dev_digest(dev) == wmv_labeler.provenance["dev_labels"]
    dev.loc[0, "label"] = 1 - dev.loc[0, "label"]  # the expert relabels one row: no generation moves, the digest does
    assert dev_digest(dev) != wmv_labeler.provenance["dev_labels"]


def test_a_bad_batch_size_is_refused_before_anything_is_written(workspace, wmv_labeler, tmp_path, capsys):
    """Caught only when the first batch was read, a batch size of 0 left a run record behind (after the fitting's
    minutes) and the folder refused the corrected rerun as another run."""
    corpus = _corpus(tmp_path, rows=20)
    with pytest.raises(ValueError, match="batch_size must be at least 1, not 0"):
        label_corpus(wmv_labeler, survey([corpus]), tmp_path / "out", batch_size=0)
    assert not (tmp_path / "out").exists()
    assert label_corpus(wmv_labeler, survey([corpus]), tmp_path / "out", batch_size=10)["rows"] == 20
    with pytest.raises(SystemExit) as usage:  # the CLI says so before it opens the workspace
        main(["label", "--workdir", str(workspace), "--input", str(corpus), "--output", str(tmp_path / "o"),
              "--batch-size", "0"])
    assert usage.value.code == 2 and "--batch-size: must be at least 1, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # --workers 0 had quietly meant the default
        main(["label", "--workdir", str(workspace), "--input", str(corpus), "--output", str(tmp_path / "o"),
              "--workers", "0"])
    assert usage.value.code == 2 and "--workers: must be at least 1, not 0" in capsys.readouterr().err
    registry = JobRegistry()
    with pytest.raises(ValueError, match="batch_size must be at least 1"):  # the studio's start button
        start_corpus_label(workspace, str(corpus), tmp_path / "o", "wmv", batch_size=0, registry=registry)
    assert registry.latest(workspace) is None and not (tmp_path / "o").exists()


def _labels_cli(workspace: Path, corpus: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "label", "--workdir", str(workspace), "--input",
                             str(corpus), "--output", str(out), "--aggregator", "wmv", "--batch-size", "100"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def test_a_killed_run_leaves_only_complete_shards_and_a_rerun_resumes_it(workspace, wmv_labeler, tmp_path):
    text = pd.read_csv(ROOT / "data/demo/youtube_spam.csv", dtype=str)["text"]
    corpus = tmp_path / "big.jsonl"
    pd.DataFrame({"text": pd.concat([text] * 4, ignore_index=True)}).to_json(corpus, orient="records", lines=True)
    out = tmp_path / "out"
    proc = _labels_cli(workspace, corpus, out)
    deadline = time.monotonic() + 120
    while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its sandbox workers, mid-run
    proc.wait()
    done = sorted(out.glob("part-*.parquet"))
    assert done and not (out / MANIFEST).exists(), "killed before the end: no manifest may claim completeness"
    assert len(done) < 83
    for shard in done:  # every shard under its final name is whole
        assert len(pd.read_parquet(shard)) == 100
    (out / ".part-000082.parquet.12345.tmp").write_bytes(b"half a shard")  # what a killed writer leaves
    resumed = _labels_cli(workspace, corpus, out)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr.decode()
    summary = json.loads(stdout.decode().strip().splitlines()[-1])
    assert summary["resumed_shards"] == len(done) and summary["rows"] == 4 * len(text)
    assert not list(out.glob(".*.tmp"))
    clean = tmp_path / "clean"
    label_corpus(wmv_labeler, survey([corpus]), clean, batch_size=100)
    pd.testing.assert_frame_equal(read_output(out), read_output(clean))
    manifest = json.loads((out / MANIFEST).read_text())
    assert [s["index"] for s in manifest["shards"]] == list(range(83))


def test_the_local_engine_never_imports_ray(workspace, tmp_path):
    corpus = _corpus(tmp_path, rows=30)
    code = ("import sys; from engine.cli import main; rc = main(['label', '--workdir', sys.argv[1], '--input', "
            "sys.argv[2], '--output', sys.argv[3], '--aggregator', 'mv']); "
            "print('RAY' if 'ray' in sys.modules else 'NORAY'); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(workspace), str(corpus), str(tmp_path / "o")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "NORAY"
    assert "rows/s" in done.stderr and "ETA" in done.stderr


def test_asking_for_ray_where_it_is_not_installed_says_how_to_get_it(workspace, tmp_path):
    corpus = _corpus(tmp_path, rows=5)
    code = ("import sys; sys.modules['ray'] = None; from engine.cli import main; sys.exit(main(['label', "
            "'--workdir', sys.argv[1], '--input', sys.argv[2], '--output', sys.argv[3], '--engine', 'ray']))")
    done = subprocess.run([sys.executable, "-c", code, str(workspace), str(corpus), str(tmp_path / "o")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "the ray engine needs Ray, which is not installed: pip install -e '.[ray]'" in done.stderr
    assert not (tmp_path / "o").exists()


def test_confidence_and_probabilities_are_consistent(wmv_labeler, tmp_path):
    label_corpus(wmv_labeler, survey([_corpus(tmp_path, rows=200)]), tmp_path / "out", batch_size=64)
    labeled = read_output(tmp_path / "out")
    probs = labeled[[f"p_{label}" for label in wmv_labeler.labels]].to_numpy()
    assert np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    voted = labeled["label"] != ""
    assert np.allclose(labeled["confidence"][voted], probs[voted.to_numpy()].max(axis=1))
    assert (labeled.loc[~voted, "n_votes"] == 0).all()


INHIBITS = '''
def annotate(example: dict) -> str | None:
    return "inhibits" if "inhibit" in example["text"] else None
'''


def test_the_corpus_labeler_reads_the_relation_feature_as_the_workspace_does(tmp_path):
    """On a relation task `auto` reads TF-IDF of the words around the two mentions by place: the corpus labeler
    builds it from each input's own spans exactly as labeling a workspace row does (same text, same vocabulary)."""
    from engine.expert import review
    from engine.ingest.importer import IngestOptions, import_frame
    from engine.labeling.features import text_features

    verbs = ("inhibits", "activates", "binds")
    rows = []
    for i in range(60):
        chem, gene, verb = f"chem{i}", f"gene{i}", verbs[i % 3]
        text = f"in cells {chem} strongly {verb} {gene} today" if i % 2 else f"{gene} is {verb} by {chem} here"
        rows.append({"id": f"r{i}", "text": text, "label": verb, "split": "dev" if i < 45 else "pool",
                     "entity1": chem, "entity2": gene, "span1": [text.index(chem), text.index(chem) + len(chem)],
                     "span2": [text.index(gene), text.index(gene) + len(gene)]})
    store = Store.open(tmp_path / "ws")
    import_frame(store, pd.DataFrame(rows), IngestOptions(labels=verbs, audit_fraction=0.0, seed=0),
                 dataset="relations", source="test")
    with SandboxExecutor(workers=1) as executor:
        assert review.submit(store, executor, INHIBITS, name="inhibits", approve_anyway=True)["added"]
        labeler = fit_labeler(store, executor, "auto")
    frame = store.examples_frame()
    expected = text_features(store, frame, ("relation",))["relation"]
    inputs = [{**fields, "text": text} for fields, text in zip(frame["fields"], frame["text"], strict=True)]
    got = labeler.features(list(frame["text"]), inputs)["relation"]
    Store.close_all()
    assert expected.nnz > 0 and got.shape == expected.shape
    assert abs(got - expected).max() < 1e-12


def test_ids_from_an_id_column_are_the_same_whatever_the_batch_and_a_missing_one_is_named(wmv_labeler, tmp_path):
    rows = [{"id": 1, "text": "subscribe"}, {"id": 2, "text": "nice song"}, {"id": 3, "text": "free"},
            {"text": "no id here"}]
    write_jsonl(tmp_path / "in.jsonl", rows[:3])
    for size in (1, 2, 3):  # batch sizes put the rows in different company: "1" stays "1"
        label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / f"out{size}", batch_size=size)
        assert list(read_output(tmp_path / f"out{size}")["id"]) == ["1", "2", "3"]
    write_jsonl(tmp_path / "gap.jsonl", rows)
    with pytest.raises(CorpusError, match="data row 3 has no 'id' value"):  # was the id "nan" (and "1.0" beside it)
        label_corpus(wmv_labeler, survey([tmp_path / "gap.jsonl"]), tmp_path / "gap", batch_size=4)


def test_auto_labels_equal_the_workspace_export_on_a_pool_larger_than_its_student_sample(workspace, tmp_path,
                                                                                        monkeypatch):
    """Past a size (6,000 pool rows on up to 40 classes) `auto`'s student learns from a seeded sample of the pool:
    the corpus labeler must hand it the sample export hands it, or the two label the same rows differently. The
    sample is shrunk to half the demo's pool here so that a small workspace is 'large'."""
    import engine.embed.cache as embed_cache
    from engine.aggregators.student import unlabeled_sample

    monkeypatch.setattr("engine.labeling.fit.auto_unlabeled_sample",
                        lambda n, seed, n_classes: unlabeled_sample(n, seed, n // 2))
    store = Store.open(workspace)
    embedded: list[int] = []
    embed_texts = embed_cache.embed_texts
    with SandboxExecutor() as executor:
        result = soft_labels(store, executor, "auto")
        monkeypatch.setattr(embed_cache, "embed_texts", lambda s, texts, *a, **k: (
            embedded.append(len(texts)), embed_texts(s, texts, *a, **k))[1])
        labeler = fit_labeler(store, executor, "auto")
    # the labeler reads dev and the student's sample: it embeds those and no other pool row
    assert embedded == [store.count_examples("dev") + store.count_examples("pool") // 2]
    corpus = tmp_path / "pool.jsonl"
    exported, pool_rows = exported_pool(store, result, corpus)
    label_corpus(labeler, survey(find_files(corpus)), tmp_path / "out", batch_size=500)
    labeled = read_output(tmp_path / "out")
    assert list(labeled["label"]) == list(pool_rows["label"]) and set(labeled["aggregator"]) == {labeler.made_by}
    probs = [c for c in exported.columns if c.startswith("p_")]  # the embedder's last digit varies with the batch
    np.testing.assert_allclose(labeled[probs].to_numpy(float), pool_rows[probs].to_numpy(float), atol=1e-5)


def test_the_corpus_columns_are_kept_between_text_and_the_label_columns(wmv_labeler, tmp_path):
    """A relation corpus's mentions and spans (any other column) reach the shard, as export keeps fields; a column
    named like one of ours is kept as `field_<name>` beside ours, and a column mixing kinds of value as text."""
    rows = [{"id": "a", "text": "subscribe to my channel", "entity1": "my", "span1": [13, 15], "label": "SPAM",
             "n": 3, "score": 1},
            {"id": "b", "text": "nice song", "entity1": "song", "span1": [5, 9], "label": "HAM", "n": 4,
             "score": "high"}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out")
    labeled = read_output(tmp_path / "out")
    assert list(labeled.columns[:7]) == ["id", "text", "entity1", "span1", "field_label", "n", "score"]
    assert list(labeled.columns[7:9]) == ["label", "confidence"] and labeled.columns[-1] == "source_row"
    assert list(labeled["entity1"]) == ["my", "song"] and list(labeled["span1"]) == ["[13, 15]", "[5, 9]"]
    assert list(labeled["field_label"]) == ["SPAM", "HAM"] and set(labeled["label"]) <= {"SPAM", "HAM", ""}
    assert list(labeled["n"]) == [3, 4] and labeled["n"].dtype == np.int64
    assert list(labeled["score"]) == ["1", "high"]
    # a corpus holding both `label` and `field_label` keeps both (the first had been written over the second)
    both = [{"id": "a", "text": "free", "label": "L1", "field_label": "F1"}]
    write_jsonl(tmp_path / "both.jsonl", both[:1])
    label_corpus(wmv_labeler, survey([tmp_path / "both.jsonl"]), tmp_path / "both")
    kept = read_output(tmp_path / "both")
    assert list(kept["field_label"]) == ["F1"] and list(kept["field_field_label"]) == ["L1"]


def test_the_pace_of_a_resumed_run_counts_only_the_rows_it_labels(monkeypatch):
    """A rerun starts at the rows its earlier shards hold: counted in, they made 592,677 rows/s and an ETA of 0 s."""
    import engine.corpus.engines as engines

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(engines.time, "monotonic", lambda: next(clock))
    pace = engines.Pace()
    assert pace.at(1_200, 3_500) == (0.0, None)  # resumed at 1,200 rows: no pace yet
    assert pace.at(1_600, 3_500) == (40.0, 47.5)  # 400 rows in 10 s; 1,900 left


SHIFTING = [  # JSONL fields typed by their batch of two: `year` int with a gap, `maybe` null then int,
    # `score` int then mixed (text), `extra` absent from the second batch
    {"text": "subscribe", "year": 2001, "maybe": None, "score": 1, "extra": "x"},
    {"text": "nice song", "year": 2002, "maybe": None, "score": 2, "extra": "y"},
    {"text": "free money", "year": None, "maybe": 5, "score": 3},
    {"text": "great", "year": 2004, "maybe": 6, "score": "high"},
    {"text": "check my channel", "year": 2005, "maybe": 7, "score": 5, "extra": "z"},
    {"text": "love it", "year": 2006, "maybe": 8, "score": 6, "extra": "w"},
]


def _one_schema(out: Path) -> pd.DataFrame:
    """The shards read as one dataset (what `pd.read_parquet`, pyarrow.dataset and DuckDB's `out/*.parquet` do),
    after checking that every shard has the same schema."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    shards = sorted(out.glob("part-*.parquet"))
    schemas = [pq.read_schema(p).remove_metadata() for p in shards]
    assert all(s.equals(schemas[0]) for s in schemas), [str(s) for s in schemas]
    return ds.dataset(shards, format="parquet").to_table().to_pandas()


def test_every_shard_of_a_run_has_one_schema_whatever_its_batch_held(wmv_labeler, tmp_path):
    """Each batch typed its JSONL fields by what it held; the folder read as one dataset failed (`int64 to null`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "in.jsonl", SHIFTING)
    label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out", batch_size=2)
    labeled = read_output(tmp_path / "out")
    pd.testing.assert_frame_equal(_one_schema(tmp_path / "out"), labeled)
    # the folder itself, as a user reads it: the manifest and run record are skipped, not read as Parquet
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out"), labeled)
    import duckdb
    pd.testing.assert_frame_equal(duckdb.sql(f"select * from read_parquet('{tmp_path / 'out'}/*.parquet') "
                                             "order by source_row").df(), labeled, check_dtype=False)
    schema = pq.read_schema(tmp_path / "out" / "part-000001.parquet")
    types, text = {f.name: f.type for f in schema}, (pa.string(), pa.large_string())
    assert types["year"] == pa.int64() and types["maybe"] == pa.int64()  # a gap keeps a batch's ints
    assert types["score"] in text and types["extra"] in text
    assert list(labeled.columns[:6]) == ["id", "text", "year", "maybe", "score", "extra"]  # corpus columns first
    assert list(labeled["score"]) == ["1", "2", "3", "high", "5", "6"] and labeled["extra"].isna().sum() == 2
    assert list(labeled["year"].fillna(0)) == [2001, 2002, 0, 2004, 2005, 2006]
    assert types["label"] in text and types["source_file"] in text  # ours keep their types
    assert {types[c] for c in ("confidence", *(f"p_{label}" for label in wmv_labeler.labels))} == {pa.float64()}
    assert types["n_votes"] == types["source_row"] == pa.int64()
    again = label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out", batch_size=2)
    assert again["resumed_shards"] == 3  # a rewritten shard keeps its record


def test_a_resumed_run_unifies_the_shards_an_earlier_run_left(wmv_labeler, tmp_path, monkeypatch):
    """The shards a killed run wrote were typed by their own batches: the rerun that completes the run unifies them
    with its own."""
    import engine.corpus.engines as engines

    write_jsonl(tmp_path / "in.jsonl", SHIFTING)
    write = engines.ShardWriter.write

    def dies_at_the_last_batch(self, batch):
        if batch.index == 2:
            raise RuntimeError("killed")
        return write(self, batch)

    monkeypatch.setattr(engines.ShardWriter, "write", dies_at_the_last_batch)
    with pytest.raises(RuntimeError, match="killed"):
        label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out", batch_size=2)
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 2 and not (tmp_path / "out" / MANIFEST).exists()
    monkeypatch.setattr(engines.ShardWriter, "write", write)
    resumed = label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out", batch_size=2)
    assert resumed["resumed_shards"] == 2 and resumed["rows"] == 6
    label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "clean", batch_size=2)
    pd.testing.assert_frame_equal(_one_schema(tmp_path / "out"), read_output(tmp_path / "clean"))


def test_a_run_written_with_the_old_manifest_name_is_still_read_and_resumed(wmv_labeler, tmp_path):
    from engine.corpus.shards import LEGACY_MANIFEST

    write_jsonl(tmp_path / "in.jsonl", SHIFTING)
    out = tmp_path / "out"
    label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), out, batch_size=2)
    labeled = read_output(out)
    (out / MANIFEST).rename(out / LEGACY_MANIFEST)  # as a run before the rename left it
    pd.testing.assert_frame_equal(read_output(out), labeled)
    again = label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), out, batch_size=2)
    assert again["resumed_shards"] == 3 and (out / MANIFEST).exists() and not (out / LEGACY_MANIFEST).exists()


def test_a_column_its_shards_cannot_share_as_numbers_becomes_text_and_the_run_still_finishes(wmv_labeler, tmp_path):
    """64-bit ids in one batch, a fraction in the next (int64, then float) do not fit a float: unifying raised and no
    manifest was ever written, on every rerun too. Such a column is text in every shard, written as a mixed batch
    writes it (Python's str: `True`, not Arrow's `true`), whichever batch it came from. A gap alone keeps ints."""
    big = 1400000000000000001
    rows = [{"text": "subscribe", "reply_to": big, "flag": True, "views": 10},
            {"text": "nice song", "reply_to": big + 1, "flag": False, "views": None},
            {"text": "free money", "reply_to": None, "flag": True, "views": big},
            {"text": "great", "reply_to": 2.5, "flag": "n/a"}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    result = label_corpus(wmv_labeler, survey([tmp_path / "in.jsonl"]), tmp_path / "out", batch_size=2)
    assert result["rows"] == 4 and (tmp_path / "out" / MANIFEST).exists()
    labeled = _one_schema(tmp_path / "out")
    assert list(labeled["reply_to"][:2]) == [str(big), str(big + 1)]  # no digit lost to a float
    assert pd.isna(labeled["reply_to"][2]) and labeled["reply_to"][3] == "2.5"
    import pyarrow.dataset as ds
    views = ds.dataset(sorted((tmp_path / "out").glob("part-*.parquet"))).to_table()["views"].to_pylist()
    assert views == [10, None, big, None]  # gaps in both batches: exact ints (pandas reads them as floats)
    assert list(labeled["flag"]) == ["True", "False", "True", "n/a"]
    pd.testing.assert_frame_equal(labeled, read_output(tmp_path / "out"))


def test_id_and_text_columns_are_found_whatever_their_case(wmv_labeler, tmp_path):
    """A spreadsheet's export names them "ID" and " Text": the ids are the file's, not `<file>:<row>`, and neither
    column rides along as a field; two columns alike but for case are refused by name (which one is meant would be a
    guess, and `<file>:<row>` ids would be the silence this ends)."""
    pd.DataFrame({"ID": ["a7", "b9"], " Text": ["subscribe to my channel", "nice song"], "likes": [3, 4]}).to_csv(
        tmp_path / "sheet.csv", index=False)
    label_corpus(wmv_labeler, survey([tmp_path / "sheet.csv"]), tmp_path / "out", batch_size=10)
    labeled = read_output(tmp_path / "out")
    assert list(labeled["id"]) == ["a7", "b9"] and list(labeled["text"]) == ["subscribe to my channel", "nice song"]
    assert "field_ID" not in labeled.columns and "ID" not in labeled.columns and "likes" in labeled.columns
    pd.DataFrame({"Id": ["a7", "b9"], "ID": ["x", "y"], "text": ["free", "song"]}).to_csv(tmp_path / "two.csv",
                                                                                           index=False)
    with pytest.raises(CorpusError, match="columns 'Id', 'ID' all stand for 'id'"):
        label_corpus(wmv_labeler, survey([tmp_path / "two.csv"]), tmp_path / "out2", batch_size=10)
