"""The output folder of a corpus run: Parquet shards written under a temporary name and renamed when complete,
a run record written first (so a rerun resumes the same run or refuses a different one, never mixes two),
and the manifest written last, listing exactly the complete shards.

A shard's own facts (rows, source, fault counts) ride in its Parquet metadata, so a resumed run can list the
shards a killed run finished without trusting anything but the files. Before the manifest, the shards are given one
schema (`unify_shards`), so the folder reads as one table in pyarrow, pandas or DuckDB.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

RUN_RECORD = "_run.json"
# "_": pyarrow, pandas and DuckDB skip it when reading the folder as a dataset (`pd.read_parquet(OUT)`)
MANIFEST = "_manifest.json"
LEGACY_MANIFEST = "manifest.json"  # its name before: a resumed or read run of that time still finds it
_META_KEY = b"evopool_shard"


class OutputError(Exception):
    """The output folder holds another run, or something that is not ours."""


@dataclass(frozen=True)
class ShardRecord:
    index: int
    file: str  # name inside the output folder
    rows: int
    source: str
    first_row: int
    faults: dict[str, int] = field(default_factory=dict)


def shard_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


def fingerprint(run: dict[str, Any]) -> str:
    """What makes two runs the same run: inputs, pool, aggregator, seed, dev labels, embedder, batch size (see
    `prepare`)."""
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prepare(output: Path, run: dict[str, Any]) -> dict[int, ShardRecord]:
    """Make `output` ready for `run` and return the shards it already holds (by batch index) when resuming.

    An empty or new folder starts the run; a folder of the same run resumes it (leftover temporary files of
    a killed writer are removed, complete shards kept); anything else is refused with what to do.
    """
    output.mkdir(parents=True, exist_ok=True)
    record_path = output / RUN_RECORD
    key = fingerprint(run)
    if record_path.exists():
        try:
            previous = json.loads(record_path.read_text())
        except ValueError:
            raise OutputError(f"{record_path} is not a run record; choose an empty output folder") from None
        if previous.get("fingerprint") != key:
            raise OutputError(f"output folder {output} holds another run ({previous.get('fingerprint')}: other "
                              "inputs, pool, aggregator, seed, dev labels or batch size); choose an empty folder or "
                              "delete that one")
    else:
        strangers = [p.name for p in output.iterdir() if not p.name.startswith(".")]
        if strangers:
            raise OutputError(f"output folder {output} is not empty and holds no run record ({', '.join(strangers[:3])}"
                              f"{', ...' if len(strangers) > 3 else ''}); choose an empty folder")
        _atomic_write(record_path, json.dumps({"fingerprint": key, "run": run}, indent=2, default=str))
    for leftover in output.glob(".part-*.tmp"):
        leftover.unlink()
    (output / MANIFEST).unlink(missing_ok=True)  # rewritten when the run completes
    (output / LEGACY_MANIFEST).unlink(missing_ok=True)
    done = {}
    for path in sorted(output.glob("part-*.parquet")):
        shard = read_record(path)
        done[shard.index] = shard
    return done


def write_shard(output: Path, frame: pd.DataFrame, record: ShardRecord) -> ShardRecord:
    """Write the shard under a temporary name and rename it: a shard's final name means it is complete."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[_META_KEY] = json.dumps(asdict(record)).encode()
    _write_table(output, table.replace_schema_metadata(meta), record.file)
    return record


def _write_table(output: Path, table, name: str) -> None:
    import pyarrow.parquet as pq

    temporary = output / f".{name}.{os.getpid()}.tmp"
    pq.write_table(table, temporary)
    os.replace(temporary, output / name)


def unify_shards(output: Path, shards: list[ShardRecord]) -> None:
    """Rewrite the shards whose schema is not the run's common one (`common_schema`), keeping their record.

    A batch's corpus columns are typed by what that batch holds (JSONL: `year` int here, float where a row lacks it,
    null where no row has it, text where it mixes kinds, absent where no row names it); readers of the whole folder
    (`pyarrow.dataset`, `pd.read_parquet`, DuckDB) take one schema and fail or mis-read the shards that differ.
    A column some shard's values do not fit in the common type (64-bit ids beside a gap: int and float, past float's
    2^53; a far date in a finer time unit) becomes text in every shard. Nothing here may cost a finished run its
    manifest: a shard that still cannot be rewritten keeps its own schema, with a warning."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = {s.file: pq.read_schema(output / s.file).remove_metadata() for s in shards}
    common = common_schema(list(schemas.values()))
    unfit = {f.name for s in shards if not schemas[s.file].equals(common)  # only the columns whose type differs
             for f in _unfit_fields(pq.read_table(output / s.file, columns=_differing(schemas[s.file], common)),
                                    common)}
    if unfit:
        common = pa.schema([pa.field(f.name, pa.large_string()) if f.name in unfit else f for f in common])
    for shard in shards:
        if schemas[shard.file].equals(common):
            continue
        try:
            table = pq.read_table(output / shard.file)
            columns = [_conformed(table, f) for f in common]
            meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"pandas"}  # names the old types
            _write_table(output, pa.table(columns, schema=common.with_metadata(meta)), shard.file)
        except pa.ArrowException as err:
            warnings.warn(f"corpus output: {shard.file} keeps its own column types ({err})", stacklevel=2)


def _differing(schema, common) -> list[str]:
    """The columns of `schema` whose type is not `common`'s."""
    return [f.name for f in common if f.name in schema.names and schema.field(f.name).type != f.type]


def _unfit_fields(table, common) -> list:
    """The fields of `common` some value of `table` does not fit (a safe cast fails)."""
    import pyarrow as pa

    unfit = []
    for f in common:
        if f.name in table.column_names and not _is_text(f.type) and table[f.name].type != f.type:
            try:
                table[f.name].cast(f.type)
            except pa.ArrowException:
                unfit.append(f)
    return unfit


def _conformed(table, f):
    """`table`'s column `f.name` in type `f.type`: nulls where the shard lacks it; text as `_kept_cells` writes a
    mixed batch (Python's `str` of each value: `True`, `1e-07`, not Arrow's `true`, `1e-7`)."""
    import pyarrow as pa

    if f.name not in table.column_names:
        return pa.nulls(len(table), f.type)
    column = table[f.name]
    if column.type == f.type:
        return column
    if _is_text(f.type) and not _is_text(column.type):
        return pa.array([None if v is None else str(v) for v in column.to_pylist()], f.type)
    return column.cast(f.type)


def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def common_schema(schemas: list):
    """Every column of any shard, each beside the columns it follows in its shard (a corpus column stays before
    ours), typed so every shard casts to it: int and float as float, null as the other type, anything else that
    differs (int in one batch, mixed and so text in another) as text, as `_kept_cells` writes a mixed batch."""
    import pyarrow as pa

    names: list[str] = []
    for schema in schemas:
        for i, name in enumerate(schema.names):
            if name not in names:
                names.insert(names.index(schema.names[i - 1]) + 1 if i else 0, name)
    fields = []
    for name in names:
        typed = [pa.schema([s.field(name)]) for s in schemas if name in s.names]
        try:
            fields.append(pa.unify_schemas(typed, promote_options="permissive").field(0))
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            fields.append(pa.field(name, pa.large_string()))
    return pa.schema(fields)


def read_record(path: Path) -> ShardRecord:
    import pyarrow.parquet as pq
    try:
        meta = pq.read_schema(path).metadata or {}
        return ShardRecord(**json.loads(meta[_META_KEY]))
    except Exception as err:
        raise OutputError(f"{path} is not a complete shard of this run ({err}); delete it and rerun") from None


def write_manifest(output: Path, shards: list[ShardRecord], extra: dict[str, Any]) -> Path:
    """The manifest, written last: every complete shard in batch order, their totals, and the run's provenance."""
    shards = sorted(shards, key=lambda s: s.index)
    faults: dict[str, int] = {}
    for shard in shards:
        for annotator, count in shard.faults.items():
            faults[annotator] = faults.get(annotator, 0) + count
    body = {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "rows": sum(s.rows for s in shards), "shards": [asdict(s) for s in shards],
            "faults": faults, **extra}
    path = output / MANIFEST
    _atomic_write(path, json.dumps(body, indent=2, default=str))
    return path


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def read_output(output: str | Path) -> pd.DataFrame:
    """Every labeled row of a finished run, in corpus order (the manifest's shards, nothing else)."""
    output = Path(output)
    manifest = output / MANIFEST
    if not manifest.exists() and (output / LEGACY_MANIFEST).exists():
        manifest = output / LEGACY_MANIFEST
    if not manifest.exists():
        raise OutputError(f"{output} has no manifest: the run did not finish")
    shards = json.loads(manifest.read_text())["shards"]
    frames = [pd.read_parquet(output / s["file"]) for s in shards]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
