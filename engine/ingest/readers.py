"""Reading user files into raw frames: CSV / TSV / JSONL / Parquet tables and WRENCH folders.

These functions only turn bytes on disk (or an upload's bytes) into a `pandas.DataFrame`; checking the rows,
drawing splits and writing the workspace happen in `engine.ingest.importer`. They are kept apart so the studio's import
form can preview a file with exactly the reader the import will use. Every failure is an `IngestError` that
says what is wrong and where (the byte and line of a bad encoding, each JSONL line that is not an object).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from engine.ingest.errors import IngestError, RowProblem


def _decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise IngestError(f"{name} is not UTF-8 text: byte 0x{raw[err.start]:02x} on line {line} "
                          "cannot be decoded; save the file as UTF-8 and upload it again") from None


def read_table(source: str | Path | bytes, name: str | None = None) -> pd.DataFrame:
    """Read CSV / JSONL / Parquet into a frame of strings (Parquet keeps its types).

    `source` is a path or the raw bytes of an upload (then `name` gives the format by extension).
    """
    name = name or str(source)
    suffix = Path(name).suffix.lower()
    raw = Path(source).read_bytes() if not isinstance(source, bytes) else source
    if suffix == ".parquet":
        try:
            return pd.read_parquet(io.BytesIO(raw))
        except Exception as err:  # pyarrow raises several types for a corrupt file
            raise IngestError(f"{name} is not a readable Parquet file: {err}") from None
    text = _decode(raw, name)
    if suffix in (".jsonl", ".ndjson", ".json"):
        records, problems = [], []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(RowProblem(i, f"not valid JSON ({err.msg} at column {err.colno})"))
                continue
            if not isinstance(record, dict):
                problems.append(RowProblem(i, "a JSONL row must be a JSON object"))
                continue
            records.append(record)
        if problems:
            raise IngestError(f"{name} has lines that are not JSON objects", problems)
        return pd.DataFrame.from_records(records)
    if suffix in (".csv", ".tsv", ".txt"):
        sep = "\t" if suffix == ".tsv" else ","
        try:
            return pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False)
        except pd.errors.ParserError as err:
            raise IngestError(f"{name} is not a well-formed CSV: {err}") from None
    raise IngestError(f"{name}: unsupported file type {suffix!r} (use .csv, .tsv, .jsonl or .parquet, "
                      "or a WRENCH folder)")


def read_wrench(folder: str | Path) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """A WRENCH folder as a frame (id, text, label index, split, field columns) and its label names.

    The `weak_labels` are dropped here: annotators and agents must never see them.
    """
    folder = Path(folder)
    label_file = folder / "label.json"
    if not label_file.exists():
        raise IngestError(f"{folder} is not a WRENCH folder: label.json is missing")
    names = json.loads(label_file.read_text())
    labels = tuple(names[str(i)] for i in range(len(names)))
    rows = []
    for file_split, split in (("train", "pool"), ("valid", "dev"), ("test", "test")):
        path = folder / f"{file_split}.json"
        if not path.exists():
            continue
        for key, record in json.loads(path.read_text()).items():
            data = dict(record.get("data", {}))
            rows.append({"id": f"{file_split}-{key}", "text": data.pop("text", None),
                         "label": record.get("label"), "split": split, **data})
    if not rows:
        raise IngestError(f"{folder} has none of train.json, valid.json, test.json")
    return pd.DataFrame.from_records(rows), labels
