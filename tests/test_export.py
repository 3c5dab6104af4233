"""The export carries what the next tool needs: dev rows' gold labels and, in the manifest, why each pool member
is there and every override the expert made (with the reason they typed). Test labels stay out of the file."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from engine.agents.offline.proposer import OfflineProposer
from engine.domain import SoftLabels
from engine.evolve import evolve
from engine.expert import review
from engine.export.files import pool_as_python, write_export
from engine.ingest.importer import IngestOptions, import_path
from engine.labeling.fit import soft_labels
from engine.sandbox.executor import SandboxExecutor


def test_export_has_dev_gold_and_the_manifest_has_verdicts_and_overrides(store, demo_csv, tmp_path):
    import_path(store, demo_csv)
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
        members = store.pool_ids()
        review.reject(store, members[0], "fires on song titles, not spam")
        review.approve(store, members[1], "precise on the rows I checked")  # confirms the gate's accept
        result = soft_labels(store, executor, "mv")
    path, manifest_path = write_export(store, result.soft, result.hard, result.n_votes, tmp_path / "out.csv")
    frame = pd.read_csv(path, keep_default_na=False)
    dev = store.examples_frame("dev").set_index("id")
    labels = store.load_task().labels
    got = frame.set_index("id")
    assert (got.loc[dev.index, "gold_label"] == [labels[int(v)] for v in dev["label"]]).all()
    assert (frame.loc[frame["split"] != "dev", "gold_label"] == "").all()  # test labels are not handed on

    manifest = json.loads(manifest_path.read_text())
    pool = set(store.pool_ids())
    assert set(manifest["pool_verdicts"]) == pool and members[0] not in pool
    assert all(v["reasons"] or v["note"] for v in manifest["pool_verdicts"].values())
    overrides = {o["annotator_id"]: o for o in manifest["expert_overrides"]}
    assert overrides[members[0]]["verdict"] == "reject"
    assert overrides[members[0]]["note"] == "fires on song titles, not spam"
    kept = manifest["pool_verdicts"][members[1]]
    assert (kept["decided_by"], kept["note"]) == ("human", "precise on the rows I checked")
    assert overrides[members[1]]["verdict"] == "approve"


@pytest.mark.parametrize("value", [[96, 117], [], [True, 1], [1.5, 2], [-1, 10**20], {"a": [1]}, ["x", 2]])
def test_a_field_cell_is_the_json_of_a_list_or_dict(value):
    """Spans skip json.dumps for speed; every list or dict must still read back as its JSON."""
    from engine.export.files import field_cell

    assert field_cell(value) == json.dumps(value)
    assert json.loads(field_cell(value)) == value


@pytest.mark.parametrize("value", ["aspirin", 3, None, 2.5])
def test_a_plain_field_cell_is_the_value_itself(value):
    from engine.export.files import field_cell

    assert field_cell(value) == value


def uniform_labels(store) -> tuple[SoftLabels, np.ndarray, np.ndarray]:
    """Soft labels for every example (no pool needed): each class equally likely, the first one chosen."""
    ids = tuple(store.examples_frame()["id"])
    k = len(store.load_task().labels)
    return (SoftLabels(np.full((len(ids), k), 1 / k), ids, "mv"), np.zeros(len(ids), dtype=np.int64),
            np.zeros(len(ids), dtype=np.int64))


def test_a_field_named_like_an_export_column_is_kept_as_field_name(store, tmp_path):
    """An input column `confidence` (or `id` when the ids come from another column, `p_<label>`, ...) was
    overwritten by the export's own column of that name, and the user's values were lost without a word."""
    clashing = {"confidence": "high", "n_votes": "3 of 5", "aggregator": "me", "gold_label": "yes", "labels": "a|b",
                "p_pos": "0.9", "id": "dup", "split": "pool"}
    rows = [{"uid": f"r{i}", "text": f"words of row {i}", "label": ("pos", "neg")[i % 2], "part": "dev",
             "batch": "b1", "field_n_votes": "taken", **clashing} for i in range(10)]
    path = tmp_path / "clash.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import_path(store, path, IngestOptions(id_column="uid", split_column="part"))
    out, _ = write_export(store, *uniform_labels(store), tmp_path / "out.csv")
    frame = pd.read_csv(out, keep_default_na=False, dtype=str)
    for name, value in clashing.items():
        if name != "n_votes":
            assert (frame[f"field_{name}"] == value).all(), name
    # the input has a field_n_votes of its own too: neither is lost
    assert (frame["field_n_votes"] == "taken").all() and (frame["field_field_n_votes"] == "3 of 5").all()
    assert frame["batch"].eq("b1").all() and frame["confidence"].eq("0.5").all() and frame["p_pos"].eq("0.5").all()
    assert set(frame["id"]) == {f"r{i}" for i in range(10)} and frame["split"].eq("dev").all()


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_a_field_of_mixed_types_is_exported_as_text_to_parquet_and_hugging_face(store, tmp_path, fmt):
    """JSONL gives a field the type of each cell ("year": 2015 here, "unknown" there); Arrow wants one type per
    column, and the export died with a pyarrow error. Such a column is written as text; missing stays missing."""
    if fmt == "hf":
        datasets = pytest.importorskip("datasets")
    years = [2015, "unknown", None, 2016]
    rows = [{"text": f"words of row {i}", "label": ("pos", "neg")[i % 2], "year": years[i % 4], "votes": i}
            for i in range(12)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import_path(store, path, IngestOptions(dev_size=8))
    out, _ = write_export(store, *uniform_labels(store), tmp_path / f"out.{fmt}", fmt)
    if fmt == "hf":
        back = pd.concat([split.to_pandas() for split in datasets.load_from_disk(str(out)).values()])
    else:
        back = pd.read_parquet(out)
    year = back.set_index("text")["year"]
    assert [year[r["text"]] for r in rows[:4] if r["year"] is not None] == ["2015", "unknown", "2016"]
    assert pd.isna(year[rows[2]["text"]])
    assert pd.api.types.is_integer_dtype(back["votes"])  # a field of one type keeps it


def test_an_export_read_back_is_labeled_from_its_gold_not_the_models_labels(store, demo_csv, tmp_path):
    """Re-importing an exported CSV took the model's `label` as gold (9 of 120 dev labels changed, test rows got
    predictions as holdout gold) and made p_* and confidence fields an annotator could read (a review)."""
    from engine.ingest.errors import IngestError
    from engine.store.workspace import Store

    import_path(store, demo_csv, IngestOptions(labels=("SPAM", "HAM", "PROMO")))  # not sorted; PROMO holds no row
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
        result = soft_labels(store, executor, "mv")
    out = tmp_path / "labels.csv"
    write_export(store, result.soft, result.hard, result.n_votes, out)
    with pytest.raises(IngestError, match="written by EvoPool: its 'label' column holds a model's labels"):
        import_path(Store.open(tmp_path / "wrong"), out)
    again = Store.open(tmp_path / "again")
    report = import_path(again, out, IngestOptions(label_column="gold_label"))
    assert any("written by EvoPool" in note and "labeled from 'gold_label'" in note for note in report.notes)
    assert again.load_task().labels == ("SPAM", "HAM", "PROMO")  # the classes and their order: its p_* columns
    # a labeled corpus (`evopool label`: the model's columns, no gold) is refused too, and says why
    shard = pd.read_csv(out, keep_default_na=False, dtype=str).drop(columns=["gold_label"])
    shard.to_csv(tmp_path / "shard.csv", index=False)
    with pytest.raises(IngestError, match="holds no gold labels"):
        import_path(Store.open(tmp_path / "shard"), tmp_path / "shard.csv")
    # ...unless its corpus had labels of its own (written as field_label), named as the label column
    shard["field_label"] = pd.read_csv(out, keep_default_na=False, dtype=str)["gold_label"]
    shard.drop(columns=["split"]).to_csv(tmp_path / "shard.csv", index=False)
    own = Store.open(tmp_path / "own")
    own_report = import_path(own, tmp_path / "shard.csv", IngestOptions(label_column="field_label"))
    assert own.count_examples("dev") + own.count_examples("test") == 120
    assert own_report.labels == ("SPAM", "HAM", "PROMO")
    assert not set(own.load_task().fields) & {"label", "confidence", "p_HAM"}
    assert any("250 test rows carry no gold" in note for note in report.notes)
    assert again.split_counts() == {"dev": 120, "pool": store.count_examples() - 120}
    dev_before = store.examples_frame("dev").set_index("id")["label"]
    dev_after = again.examples_frame("dev").set_index("id")["label"]
    labels_before, labels_after = store.load_task().labels, again.load_task().labels
    assert {i: labels_after[int(v)] for i, v in dev_after.items()} == \
        {i: labels_before[int(v)] for i, v in dev_before.items()}  # the expert's labels, every one
    fields = set(again.load_task().fields)
    assert not fields & {"label", "confidence", "n_votes", "aggregator", "p_HAM", "p_SPAM", "gold_label"}


def test_the_pool_file_goes_nowhere_the_export_or_the_workspace_or_a_stranger_is(store, demo_csv, tmp_path):
    from engine.export.files import check_pool_destination, pool_as_python

    import_path(store, demo_csv)
    out = tmp_path / "labels.csv"
    for path, said in ((out, "the export's own file"), (tmp_path / "labels.csv.manifest.json", "its manifest"),
                       (store.path, "the workspace's own database")):
        with pytest.raises(ValueError, match=said):
            check_pool_destination(store, path, out)
    stranger = tmp_path / "notes.py"
    stranger.write_text("print('mine')\n")
    with pytest.raises(ValueError, match="is not an exported pool"):
        check_pool_destination(store, stranger, out)
    earlier = tmp_path / "pool.py"
    earlier.write_text(pool_as_python(store))
    check_pool_destination(store, earlier, out)  # an earlier pool file is replaced


def test_a_vote_names_the_same_label_in_the_sandbox_the_compiled_path_the_specs_and_the_exported_runner():
    """The rule (a label, or the one label it folds to: `'spam'` for SPAM) lives in LabelIndex; the exported pool's
    runner keeps a copy (it runs without EvoPool) and the compiled path applies it to a template's label: all agree."""
    from engine.agents.llm.spec_mode import _label
    from engine.apply.compiled import compile_annotator, scan
    from engine.domain import Task
    from engine.sandbox.checks import LabelIndex
    from engine.specs.templates import AnnotatorSpec, render

    labels = ("HAM", "SPAM", "Other", "OTHER", "naïve")
    votes = ["SPAM", "spam", " Ham\n", "other", "OTHER", "NAÏVE", "nope", 1, None]

    class _Store:
        def load_task(self):
            return Task("t", labels, {}, "")

        def pool_ids(self):
            return []

        def annotators(self, ids):
            return []

    runner: dict = {"__name__": "loaded"}
    exec(compile(pool_as_python(_Store()), "pool.py", "exec"), runner)  # noqa: S102 - our own export, loaded
    index = LabelIndex(labels)
    expected = [index.of(v) for v in votes]
    assert expected == [1, 1, 0, None, 3, 4, None, None, None]
    assert [runner["_as_label"](v) for v in votes] == [None if i is None else labels[i] for i in expected]
    for vote, i in zip(votes, expected, strict=True):
        if isinstance(vote, str) and vote.strip() and i is not None:
            assert _label(vote, Task("t", labels, {}, "")) == labels[i]
    compiled = compile_annotator(render(AnnotatorSpec("cue", "spam", "sentence", ("free",))))
    assert compiled is not None
    (result,) = scan([compiled], [{"text": "free prize"}, {"text": "hello"}], list(labels))
    assert result.votes.tolist() == [1, -1] and result.faults == 0
