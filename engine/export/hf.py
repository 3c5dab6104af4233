"""The labeled dataset in the Hugging Face `datasets` layout: a DatasetDict (one split per workspace split:
dev, pool, test) saved to disk, whose `label` and `gold_label` are ClassLabel features (on a multi-label task
`labels` and `gold_label` are sequences of them, [] for none), so `datasets.load_from_disk(path)` gives the next
tool the class names.

`datasets` is an optional extra (`pip install 'evopool-studio[hf]'`); it is imported only here, on use.
"""
from __future__ import annotations

import importlib.util
import io
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

HF_MISSING = ("the Hugging Face layout needs the `datasets` package, which is not installed: "
              "pip install 'evopool-studio[hf]' (or pip install datasets)")
MARKER = "dataset_dict.json"  # what save_to_disk writes at the top of a DatasetDict folder


def hf_available() -> bool:
    """Whether `datasets` can be imported here (without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("datasets") is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules
        return False


def arrow_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with each object column Arrow cannot type (a field of mixed types, e.g. JSONL's `"year": 2015` on one
    row and `"unknown"` on another) as strings, missing cells kept missing: Parquet and `datasets` need one type
    per column and refused the whole export with a pyarrow error. Other columns are left as they are."""
    import pyarrow as pa

    out = frame
    for column in frame.columns:
        if frame[column].dtype != object:
            continue
        try:
            pa.array(frame[column], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            out = out.copy() if out is frame else out
            out[column] = [None if pd.api.types.is_scalar(v) and pd.isna(v) else str(v) for v in frame[column]]
    return out


def _class_ids(names: pd.Series, labels: tuple[str, ...]) -> list[int]:
    index = {label: i for i, label in enumerate(labels)}
    return [index.get(n, -1) if isinstance(n, str) else -1 for n in names]  # -1: no label (ClassLabel's "missing")


def dataset_dict(frame: pd.DataFrame, labels: tuple[str, ...], separator: str = "|"):
    """The export frame as a DatasetDict keyed by split; label columns become ClassLabel ids (-1: none), lists of
    them on a multi-label frame (one with `labels`)."""
    if not hf_available():
        raise RuntimeError(HF_MISSING)
    from datasets import ClassLabel, Dataset, DatasetDict, Sequence

    table = arrow_safe(frame).copy()
    class_label = ClassLabel(names=list(labels))
    casts = {}
    if "label" in table:
        table["label"] = _class_ids(table["label"], labels)
        casts["label"] = class_label
    # the task's type (a multi-label frame has `labels`) decides gold_label's feature, never its cells: a
    # single label may hold the separator, and a dev split may happen to hold only one-label sets
    multi = "labels" in table
    index = {label: i for i, label in enumerate(labels)}
    for column in [c for c in ("labels", "gold_label") if multi and c in table]:
        table[column] = [[index[p] for p in str(s).split(separator) if p in index] for s in table[column]]
        casts[column] = Sequence(class_label)
    if "gold_label" in table and not multi:
        table["gold_label"] = _class_ids(table["gold_label"], labels)
        casts["gold_label"] = class_label
    whole = Dataset.from_pandas(table.reset_index(drop=True), preserve_index=False)
    for column, feature in casts.items():
        whole = whole.cast_column(column, feature)
    splits = table["split"].to_numpy()
    return DatasetDict({str(s): whole.select(np.flatnonzero(splits == s)).flatten_indices()
                        for s in pd.unique(splits)})


def write_hf(frame: pd.DataFrame, labels: tuple[str, ...], out: str | Path, separator: str = "|") -> Path:
    """Save the DatasetDict to the folder `out`: built in a temporary folder beside it, then renamed, so a killed
    export leaves no folder that looks complete. An earlier export at `out` is replaced; any other folder that is
    not empty is refused."""
    out = Path(out)
    if out.exists() and (out.is_file() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise FileExistsError(f"{out} exists and is not an earlier Hugging Face export; choose another path")
    data = dataset_dict(frame, labels, separator)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        data.save_to_disk(str(partial / "d"))
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial / "d", out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def hf_zip_bytes(frame: pd.DataFrame, labels: tuple[str, ...], folder_name: str, separator: str = "|") -> bytes:
    """The saved DatasetDict folder as a zip (for a download button): unzip, then datasets.load_from_disk."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = write_hf(frame, labels, Path(tmp) / folder_name, separator)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(saved.rglob("*")):
                if path.is_file():
                    archive.write(path, str(path.relative_to(saved.parent)))
        return buffer.getvalue()
