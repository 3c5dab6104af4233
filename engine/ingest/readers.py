"""Reading user files into raw frames: CSV / TSV / JSONL / Parquet tables and WRENCH folders.

These functions only turn bytes on disk (or an upload's bytes) into a `pandas.DataFrame`; checking the rows,
drawing splits and writing the workspace happen in `engine.ingest.importer`. They are kept apart so the studio's import
form can preview a file with exactly the reader the import will use. Every failure is an `IngestError` that
says what is wrong and where (the byte and line of a bad encoding, each JSONL line that is not an object).
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

import pandas as pd

from engine.ingest.errors import IngestError, RowProblem

# csv's default cell limit (131,072 characters) refused a file with one long judgment; a C long caps it
# (32 bits on Windows). Set before each read: it is csv's one global setting
CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)

# frame.attrs key: the index is each row's 0-based place in its file, set by these readers only (a caller's own
# frame may hold any integers there: a filtered frame's 0, 2, 3, ...)
ROW_POSITIONS = "row_positions"


def _decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise IngestError(f"{name} is not UTF-8 text: byte 0x{raw[err.start]:02x} on line {line} "
                          "cannot be decoded; save the file as UTF-8 and upload it again") from None


def read_table(source: str | Path | bytes, name: str | None = None) -> pd.DataFrame:
    """Read CSV / JSONL / Parquet into a frame of strings (Parquet keeps its types); any bad row refuses the file.

    `source` is a path or the raw bytes of an upload (then `name` gives the format by extension).
    """
    frame, problems = read_rows(source, name)
    if problems:
        raise IngestError(f"{name or source!s} has rows that cannot be read", problems)
    return frame


def read_rows(source: str | Path | bytes, name: str | None = None) -> tuple[pd.DataFrame, list[RowProblem]]:
    """The readable rows of a file and a problem for each row that is not (a ragged CSV row, a bad JSONL line).

    The frame's index is each row's 0-based position among the file's data rows (marked so in
    `attrs[ROW_POSITIONS]`), so a later check can still name the row of the file after bad rows were dropped. A
    file that cannot be read at all (empty, not UTF-8, not Parquet, an unknown type) raises `IngestError`.
    """
    name = str(name or source)
    suffix = Path(name).suffix.lower()
    raw = Path(source).read_bytes() if not isinstance(source, bytes) else source
    if not raw.strip():
        raise IngestError(f"{name} is empty: there is nothing to import")
    if suffix == ".parquet":
        frame, problems = _read_parquet(raw, name), list[RowProblem]()
    elif suffix in (".jsonl", ".ndjson", ".json"):
        frame, problems = _read_jsonl(_decode(raw, name))
    elif suffix in (".csv", ".tsv", ".txt"):
        frame, problems = _read_delimited(_decode(raw, name), "\t" if suffix == ".tsv" else ",", name)
    else:
        raise IngestError(f"{name}: unsupported file type {suffix!r} (use .csv, .tsv, .jsonl or .parquet, "
                          "or a WRENCH folder)")
    frame.attrs[ROW_POSITIONS] = True
    return frame, problems


def _read_parquet(raw: bytes, name: str) -> pd.DataFrame:
    """A Parquet file's columns, with a plain 0..n-1 index: the index pandas restores is no row number."""
    try:
        frame = pd.read_parquet(io.BytesIO(raw))
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{name} is not a readable Parquet file: {err}") from None
    if any(level is not None for level in frame.index.names):  # `df.set_index("pmid")`: its ids are data
        clash = [str(level) for level in frame.index.names if level in frame.columns]
        if clash:
            raise IngestError(f"{name}: its index and a column are both named {', '.join(map(repr, clash))}; "
                              "rename one and save the file again")
        frame = frame.reset_index()  # as engine/corpus/reading.py reads it
    return frame.reset_index(drop=True)  # an unnamed index (a filtered frame's 0, 2, 3, ...) is dropped


# JSON text reaches a lone surrogate only through a \uD800-\uDFFF escape (decoded UTF-8 holds none): lines without
# one (nearly all) skip the walk below
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(record: dict) -> str | None:
    """Where a parsed JSON record holds a lone UTF-16 surrogate (JSON's "\\ud800" escape parses to one), or None.

    Such a string is not Unicode text: pandas, Arrow and DuckDB refuse to store it, and one would sink the whole
    file with an encoding error that names no row."""
    def bad(value: object) -> bool:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
            return False
        if isinstance(value, dict):
            return any(bad(k) or bad(v) for k, v in value.items())
        if isinstance(value, list):
            return any(bad(v) for v in value)
        return False

    for key, value in record.items():
        if bad(key) or bad(value):
            return repr(key.encode("utf-8", "backslashreplace").decode("utf-8"))
    return None


def _surrogate_reason(field: str) -> str:
    return (f"{field} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text; "
            "fix or drop that character")


def _read_jsonl(text: str) -> tuple[pd.DataFrame, list[RowProblem]]:
    records, index, problems = [], [], []
    # "\n" only: str.splitlines() also breaks at U+2028, U+2029, \x85 and \x0c, which JSON strings may hold raw
    # (json.dumps(ensure_ascii=False) and our own JSONL export write them so)
    # a raw CR is never inside a JSON string (control characters are escaped there): CRLF and CR-only files too
    for i, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1):
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
        field = lone_surrogate(record) if SURROGATE_ESCAPE.search(line) else None
        if field is not None:
            problems.append(RowProblem(i, _surrogate_reason(field)))
            continue
        records.append(record)
        index.append(i - 1)
    # dtype=object: each cell as JSON wrote it; inferred, a column with a gap became float (a 64-bit id lost its last
    # digits, 2015 became 2015.0)
    return pd.DataFrame(records, index=pd.Index(index, dtype="int64"), dtype=object), problems


def _read_delimited(text: str, sep: str, name: str) -> tuple[pd.DataFrame, list[RowProblem]]:
    """CSV / TSV cells as strings (empty cells stay ""); a row with more or fewer cells than the header is a problem.

    A quote left open swallows every line after it into one cell, so the rows it took are never seen: a record
    that runs to the end of the file inside a quote, or that spans several lines and has the wrong cell count,
    refuses the file (naming the line where it started) rather than becoming one skippable bad row."""
    lines = io.StringIO(text, newline="").readlines()  # the lines as the reader counts them
    csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.reader(lines, delimiter=sep)
    try:
        header = next(reader)
        rows, index, problems = [], [], []
        end = reader.line_num
        for row_no, cells in enumerate(reader, start=1):
            start, end = end + 1, reader.line_num  # the record's first and last line of the file
            if not cells:  # a blank line
                continue
            if end > start and (len(cells) != len(header) or not quoted_cleanly(lines[start - 1:end], sep)):
                raise IngestError(f"{name}: {swallowed_lines(start, end, end == len(lines))}")
            cells = unquoted_tsv(lines[start - 1], cells, sep) if end == start else cells
            if len(cells) != len(header):
                problems.append(RowProblem(row_no, f"{len(cells)} cells where the header has {len(header)} "
                                                   f"(line {start} of the file; a stray "
                                                   f"{'separator' if len(cells) > len(header) else 'line break'} or "
                                                   "an unclosed quote?)"))
                continue
            rows.append(cells)
            index.append(row_no - 1)
    except csv.Error as err:
        raise IngestError(f"{name} is not a well-formed CSV: {err} (line {reader.line_num})") from None
    header = [h.strip() or f"Unnamed: {i}" for i, h in enumerate(header)]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise IngestError(f"{name}: the header names column(s) {', '.join(map(repr, repeated))} more than once")
    return pd.DataFrame(rows, columns=header, index=pd.Index(index, dtype="int64"), dtype=str), problems


def quoted_cleanly(record_lines: list[str], sep: str = ",") -> bool:
    """Whether a record that spans several lines (`record_lines`) is one the strict parser reads too: a cell quoted
    to hold line breaks is; a quote that swallowed the rows after it is not, whether it runs to the end of the file
    ("unexpected end of data") or a later stray quote closes it (`5" tall`: "',' expected after '"'"). The lenient
    parser took the rows in between as one cell and said nothing (60 rows imported as 56, one row labeled with
    another's label)."""
    try:
        list(csv.reader(record_lines, delimiter=sep, strict=True))
    except csv.Error:
        return False
    return True


def unquoted_tsv(line: str, cells: list[str], sep: str) -> list[str]:
    """A TSV line's cells as written when its quotes are not CSV quoting: a tab-separated file seldom quotes, and
    `"Hello" he said` was read as `Hello he said` (the quotes taken for a quoted cell's). A line the strict parser
    reads (a properly quoted cell, or no quote at all) keeps the parser's cells."""
    if sep != "\t" or '"' not in line or quoted_cleanly([line], sep):
        return cells
    return line.rstrip("\r\n").split("\t")


def swallowed_lines(start: int, end: int, at_end: bool) -> str:
    """What is wrong with a record from line `start` to `end` that a quote stretched, and what to do."""
    return (f"the quote opened on line {start} is not closed where it should be: the record starting there runs "
            f"to line {end}{' (the end of the file)' if at_end else ''} and takes the {end - start} line(s) after "
            "it as one cell; close or remove that quote")


ROW_PLACES = "row_places"  # frame.attrs key: {row position: what names the row}, where "row N" would not


def _json_object(path: Path, what: str) -> tuple[dict, str]:
    """A WRENCH file's JSON, which must be an object, and its text; anything else is an IngestError naming the
    file."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        raise IngestError(f"{path.name} is not UTF-8 text; save it as UTF-8") from None
    except json.JSONDecodeError as err:
        raise IngestError(f"{path.name} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, dict):
        raise IngestError(f"{path.name} must be a JSON object of {what}, not a {type(data).__name__}")
    return data, text


def read_wrench(folder: str | Path) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """`read_wrench_rows` for a folder that must be clean: any bad record refuses it."""
    frame, labels, problems = read_wrench_rows(folder)
    if problems:
        raise IngestError(f"{folder} has records that cannot be read", problems)
    return frame, labels


def read_wrench_rows(folder: str | Path) -> tuple[pd.DataFrame, tuple[str, ...], list[RowProblem]]:
    """A WRENCH folder as a frame (id, text, label name, split, field columns), its label names, and a problem
    for each record whose label is no index of label.json.

    Labels are turned into names here, where they are known to be indices: a table's cell "1" is the label named
    "1". The `weak_labels` are dropped: annotators and agents must never see them. The frame's
    `attrs[ROW_PLACES]` names each row by its file and record ("valid.json record 5"), for the row problems.
    """
    folder = Path(folder)
    label_file = folder / "label.json"
    if not label_file.exists():
        raise IngestError(f"{folder} is not a WRENCH folder: label.json is missing")
    names, _ = _json_object(label_file, 'label names by index ({"0": "neg", "1": "pos"})')
    missing = [str(i) for i in range(len(names)) if str(i) not in names]
    if missing:
        raise IngestError(f"label.json must name the labels 0 to {len(names) - 1}; it has no "
                          f"{', '.join(map(repr, missing))} (its keys: {', '.join(map(repr, names))})")
    labels = tuple(str(names[str(i)]) for i in range(len(names)))
    rows, index, places, problems = [], [], dict[int, str](), list[RowProblem]()
    for file_split, split in (("train", "pool"), ("valid", "dev"), ("test", "test")):
        path = folder / f"{file_split}.json"
        if not path.exists():
            continue
        records, text = _json_object(path, 'records by id ({"0": {"data": {"text": ...}, "label": 0}})')
        escapes = SURROGATE_ESCAPE.search(text) is not None
        for key, record in records.items():
            data = record.get("data", {}) if isinstance(record, dict) else None
            if not isinstance(data, dict):
                what = "its data" if isinstance(record, dict) else "a record"
                raise IngestError(f"{path.name}, record {key}: {what} must be a JSON object "
                                  '({"data": {"text": ...}, "label": 0})')
            field = lone_surrogate(record) if escapes else None
            if field is not None:
                raise IngestError(f"{path.name}, record {key}: {_surrogate_reason(field)}")
            position = len(places)
            places[position] = f"{path.name} record {key}"
            label, refused = _wrench_label(record.get("label"), labels)
            if refused:
                problems.append(RowProblem(position + 1, refused, places[position]))
                continue
            data = dict(data)
            rows.append({"id": f"{file_split}-{key}", "text": data.pop("text", None),
                         "label": label, "split": split, **data})
            index.append(position)
    if not places:
        raise IngestError(f"{folder} has none of train.json, valid.json, test.json")
    frame = pd.DataFrame(rows, index=pd.Index(index, dtype="int64"), dtype=object)  # as JSONL: no int turns float
    frame.attrs[ROW_PLACES] = places
    frame.attrs[ROW_POSITIONS] = True
    return frame, labels, problems


def _wrench_label(value, labels: tuple[str, ...]) -> tuple[str | None, str | None]:
    """A WRENCH record's label index as its name (None: no label), or why it names none."""
    if value is None:
        return None, None
    text = str(value).strip()
    if not isinstance(value, bool) and text.lstrip("-").isdigit() and 0 <= int(text) < len(labels):
        return labels[int(text)], None
    return None, f"label {value!r} is not a label index of label.json (0 to {len(labels) - 1})"
