"""The labeled dataset as CSV, Parquet and a Hugging Face DatasetDict, through the CLI, each loaded back with
its own reader (pandas, datasets.load_from_disk): the same rows, labels and probabilities in every format."""
from __future__ import annotations

import io
import json
import sys

import pandas as pd
import pytest
from conftest import DEMO_CSV
from test_cli import evopool

from engine.cli import main
from engine.export.files import FORMULA_START, frame_bytes, spreadsheet_safe
from engine.export.hf import HF_MISSING, hf_available
from engine.store.workspace import Store


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> str:
    ws = str(tmp_path_factory.mktemp("formats") / "ws")
    _, out = evopool("run", str(DEMO_CSV), "--workdir", ws, "--generations", "1", "--seed", "0")
    assert out.returncode == 0, out.stderr
    return ws


def export(ws: str, out, fmt: str) -> dict:
    result, done = evopool("export", "--workdir", ws, "--out", str(out), "--aggregator", "mv", "--format", fmt)
    assert done.returncode == 0, done.stderr
    return result


def test_parquet_and_csv_hold_the_same_labels(workspace, tmp_path):
    export(workspace, tmp_path / "a.csv", "csv")
    export(workspace, tmp_path / "a.parquet", "parquet")
    csv = pd.read_csv(tmp_path / "a.csv", keep_default_na=False).set_index("id")
    parquet = pd.read_parquet(tmp_path / "a.parquet").set_index("id")
    assert list(parquet.columns) == list(csv.columns) and len(parquet) == len(csv) == 2056
    parquet = parquet.loc[csv.index]
    for column in ("label", "gold_label", "split", "text"):
        assert (parquet[column].astype(str) == csv[column].astype(str)).all(), column
    assert (parquet["p_SPAM"] - csv["p_SPAM"]).abs().max() < 1e-6
    assert (tmp_path / "a.parquet.manifest.json").exists()


def test_a_spreadsheet_safe_csv_quotes_what_a_spreadsheet_would_run():
    """Text cells that start a formula get a leading apostrophe; numbers, other text and other formats stay."""
    frame = pd.DataFrame({"id": ["a", "b", "c", "d", "e", "f"],
                          "text": ['=HYPERLINK("http://x","win")', "+1 555", "-- sub4sub", "@me", "\tcmd", "fine"],
                          "p_SPAM": [-0.0, 1.0, 0.5, 0.25, 0.0, 1.0]})
    safe, quoted = spreadsheet_safe(frame)
    assert quoted == 5 and safe["text"].tolist() == ["'" + t for t in frame["text"][:5]] + ["fine"]
    assert safe["id"].tolist() == frame["id"].tolist() and safe["p_SPAM"].equals(frame["p_SPAM"])
    assert frame["text"].iloc[0].startswith("=")  # the caller's frame is left as it was
    back = pd.read_csv(io.BytesIO(frame_bytes(frame, "csv", spreadsheet=True)), keep_default_na=False)
    assert back["text"].tolist() == safe["text"].tolist()
    plain = pd.read_csv(io.BytesIO(frame_bytes(frame, "csv")), keep_default_na=False)
    assert plain["text"].tolist() == frame["text"].tolist()
    with pytest.raises(ValueError, match="only a CSV"):
        frame_bytes(frame, "jsonl", spreadsheet=True)


def test_the_cli_writes_a_spreadsheet_safe_csv_and_counts_its_quoted_cells(workspace, tmp_path):
    plain_out, safe_out = tmp_path / "plain.csv", tmp_path / "safe.csv"
    export(workspace, plain_out, "csv")
    _, done = evopool("export", "--workdir", workspace, "--out", str(safe_out), "--aggregator", "mv",
                      "--spreadsheet-safe")
    assert done.returncode == 0, done.stderr
    plain = pd.read_csv(plain_out, keep_default_na=False, dtype=str)
    safe = pd.read_csv(safe_out, keep_default_na=False, dtype=str)
    risky = plain["text"].str.startswith(FORMULA_START)
    assert risky.any()  # the demo's comments hold some ("-" and "+" lead a few)
    assert (safe["text"][risky] == "'" + plain["text"][risky]).all()
    assert safe["text"][~risky].equals(plain["text"][~risky])
    manifest = json.loads((tmp_path / "safe.csv.manifest.json").read_text())
    text_columns = [c for c in plain.columns if not c.startswith("p_") and c not in ("confidence", "n_votes")]
    quoted = sum(int(plain[c].str.startswith(FORMULA_START).sum()) for c in text_columns)
    assert manifest["spreadsheet_safe"]["quoted_cells"] == quoted > 0
    _, refused = evopool("export", "--workdir", workspace, "--out", str(tmp_path / "x.parquet"), "--aggregator",
                         "mv", "--spreadsheet-safe")
    assert refused.returncode == 2 and "--spreadsheet-safe" in refused.stderr and not (tmp_path / "x.parquet").exists()


def test_the_hugging_face_layout_loads_back_with_class_labels(workspace, tmp_path):
    datasets = pytest.importorskip("datasets")
    export(workspace, tmp_path / "a.csv", "csv")
    export(workspace, tmp_path / "hf", "hf")
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))
    csv = pd.read_csv(tmp_path / "a.csv", keep_default_na=False)
    assert isinstance(loaded, datasets.DatasetDict)
    assert {s: len(loaded[s]) for s in loaded} == csv["split"].value_counts().to_dict()
    label = loaded["dev"].features["label"]
    assert isinstance(label, datasets.ClassLabel) and label.names == ["HAM", "SPAM"]
    assert isinstance(loaded["dev"].features["gold_label"], datasets.ClassLabel)
    for split in loaded:
        back = loaded[split].to_pandas().set_index("id")
        want = csv[csv["split"] == split].set_index("id").loc[back.index]
        names = [label.int2str(int(i)) if i >= 0 else "" for i in back["label"]]
        assert names == want["label"].tolist()
        gold = [label.int2str(int(i)) if i >= 0 else "" for i in back["gold_label"]]
        assert gold == want["gold_label"].tolist()
        assert (back["p_SPAM"] - want["p_SPAM"]).abs().max() < 1e-6
    assert (tmp_path / "hf.manifest.json").exists()
    # a second export replaces the first; a folder that is not an export is refused
    export(workspace, tmp_path / "hf", "hf")
    assert datasets.load_from_disk(str(tmp_path / "hf"))["dev"].num_rows == loaded["dev"].num_rows
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    _, refused = evopool("export", "--workdir", workspace, "--out", str(tmp_path / "mine"), "--aggregator", "mv",
                         "--format", "hf")
    assert refused.returncode == 1 and "not an earlier Hugging Face export" in refused.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_without_datasets_the_hf_format_says_how_to_install_it(workspace, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    assert not hf_available()
    try:
        code = main(["export", "--workdir", workspace, "--out", str(tmp_path / "hf"), "--format", "hf"])
    finally:
        Store.close_all()  # in this process: let the next test's CLI open the workspace
    assert code == 1
    assert HF_MISSING in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_the_studio_download_zip_unzips_to_a_loadable_dataset(workspace, tmp_path):
    datasets = pytest.importorskip("datasets")
    import zipfile

    from engine.export.hf import hf_zip_bytes

    export(workspace, tmp_path / "a.csv", "csv")
    frame = pd.read_csv(tmp_path / "a.csv", keep_default_na=False)
    (tmp_path / "z.zip").write_bytes(hf_zip_bytes(frame, ("HAM", "SPAM"), "demo-labels"))
    zipfile.ZipFile(tmp_path / "z.zip").extractall(tmp_path / "unzipped")
    loaded = datasets.load_from_disk(str(tmp_path / "unzipped" / "demo-labels"))
    assert sum(len(loaded[s]) for s in loaded) == len(frame)
    assert loaded["test"].features["label"].names == ["HAM", "SPAM"]


def test_hugging_face_gold_label_features_follow_the_task_type_not_the_cells():
    datasets = pytest.importorskip("datasets")
    from engine.export.hf import dataset_dict

    def frame(column: str, predicted: list[str], gold: list[str]) -> pd.DataFrame:
        return pd.DataFrame({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "split": ["dev", "dev", "pool"],
                             column: predicted, "gold_label": gold})

    # single-label: a label holding the separator is still one class
    single = dataset_dict(frame("label", ["spam|ads", "ham", ""], ["spam|ads", "ham", ""]), ("ham", "spam|ads"))
    gold = single["dev"].features["gold_label"]
    assert isinstance(gold, datasets.ClassLabel) and gold.names == ["ham", "spam|ads"]
    assert single["dev"]["gold_label"] == [1, 0] and single["pool"]["gold_label"] == [-1]
    # multi-label: gold_label is a list of class ids like `labels`, whether or not a dev row has two labels
    labels = ("politics", "sports", "tech")
    for gold_cells, want in ((["sports", "tech", ""], [[1], [2]]), (["politics|sports", "tech", ""], [[0, 1], [2]])):
        multi = dataset_dict(frame("labels", ["sports", "tech|sports", ""], gold_cells), labels)
        features = multi["dev"].features
        assert features["gold_label"] == features["labels"] == datasets.Sequence(datasets.ClassLabel(names=[*labels]))
        assert multi["dev"]["gold_label"] == want and multi["pool"]["gold_label"] == [[]]
