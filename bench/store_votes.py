"""Vote storage before and after packing: file size, write and read time at N rows x 50 annotators.

  before  one row per non-abstain vote in `votes (annotator_id, example_id, vote)`, written and read the way
          `PoolMixin` did up to migration 006 (a DataFrame registered and inserted per annotator and split; the
          read a filtered SELECT scattered into a dense int32 matrix), on a bare DuckDB file with the same
          `examples` table
  after   the store as it is: `Store.save_votes` per annotator and split, `Store.vote_matrix` of the pool split
          (int8 codes in one BLOB per annotator and chunk of 65,536 rows)

Rows: N synthetic rows (ids like ChemProt's bench rows, `pool-<n>`), 90 % pool, 5 % dev, 5 % test. Votes: each
annotator fires on `--fired` of the rows (default 0.077, what the ChemProt pool fires on in bench/throughput.py)
with a class out of 13; the same seeded matrix goes into both. Sizes are the DuckDB file after CHECKPOINT.
Also timed after: a read right after moving 100 pool rows into dev (the cached split rows are read again).

    python bench/store_votes.py [--rows 100000 1000000] [--annotators 50] [--out bench/results/store_votes]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.throughput import measured, run_meta, save_result  # noqa: E402
from engine.domain import ABSTAIN  # noqa: E402
from engine.store.workspace import DB_NAME, Store  # noqa: E402

TMP = ROOT / "bench" / "results" / "tmp" / "store_votes"
SPLITS = ("pool", "dev", "test")


def rows_frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    split = rng.choice(SPLITS, size=n, p=[0.9, 0.05, 0.05])
    return pd.DataFrame({"id": [f"pool-{i}" for i in range(n)], "text": "t", "fields": [{}] * n, "split": split,
                         "label": pd.array([None if s == "pool" else 1 for s in split], dtype="Int64")})


def vote_columns(n: int, annotators: int, fired: float, seed: int = 1):
    """The matrix one annotator column at a time (a (1M, 50) int64 matrix would itself be 400 MB)."""
    rng = np.random.default_rng(seed)
    for _ in range(annotators):
        yield np.where(rng.random(n) < fired, rng.integers(0, 13, n), ABSTAIN).astype(np.int64)


def file_mb(workdir: Path) -> float:
    return round(sum(p.stat().st_size for p in workdir.iterdir() if p.name.startswith(DB_NAME)) / 2**20, 1)


def bench_before(frame: pd.DataFrame, annotators: int, fired: float) -> dict:
    import duckdb

    workdir = TMP / "before"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    con = duckdb.connect(str(workdir / DB_NAME))
    con.execute("CREATE TABLE examples (id VARCHAR PRIMARY KEY, ord INTEGER, split VARCHAR)")
    con.register("incoming_rows", pd.DataFrame({"id": frame["id"], "ord": np.arange(len(frame)),
                                                "split": frame["split"]}))
    con.execute("INSERT INTO examples SELECT * FROM incoming_rows")
    con.execute("CREATE TABLE votes (annotator_id VARCHAR, example_id VARCHAR, vote INTEGER)")
    con.execute("CHECKPOINT")
    size_rows_only = file_mb(workdir)
    ids = frame["id"].to_numpy(dtype=object)
    names = [f"{j:016x}" for j in range(annotators)]  # annotator ids are 16-hex code hashes
    started = time.perf_counter()
    for name, votes in zip(names, vote_columns(len(frame), annotators, fired), strict=True):
        for split in SPLITS:
            rows = (frame["split"] == split).to_numpy()
            fired_rows = rows & (votes != ABSTAIN)
            con.execute("BEGIN TRANSACTION")
            con.execute("DELETE FROM votes WHERE annotator_id = ? AND example_id IN "
                        "(SELECT id FROM examples WHERE split = ?)", [name, split])
            con.register("incoming_votes", pd.DataFrame({"annotator_id": name, "example_id": ids[fired_rows],
                                                         "vote": votes[fired_rows].astype(np.int32)}))
            con.execute("INSERT INTO votes SELECT * FROM incoming_votes")
            con.unregister("incoming_votes")
            con.execute("COMMIT")
    write_s = time.perf_counter() - started
    con.execute("CHECKPOINT")
    size = file_mb(workdir)
    started = time.perf_counter()
    example_ids = [r[0] for r in con.execute("SELECT id FROM examples WHERE split = 'pool' ORDER BY ord").fetchall()]
    dense = np.full((len(example_ids), annotators), ABSTAIN, dtype=np.int32)
    sparse = con.execute("SELECT annotator_id, example_id, vote FROM votes WHERE annotator_id IN (SELECT unnest(?)) "
                         "AND example_id IN (SELECT id FROM examples WHERE split = 'pool')", [names]).df()
    row_of = pd.Series(np.arange(len(example_ids)), index=pd.Index(example_ids))
    col_of = pd.Series(np.arange(annotators), index=pd.Index(names))
    dense[row_of[sparse["example_id"]].to_numpy(), col_of[sparse["annotator_id"]].to_numpy()] = sparse["vote"]
    read_s = time.perf_counter() - started
    stored = con.execute("SELECT count(*) FROM votes").fetchone()[0]
    con.close()
    return {"format": "before: a row per vote", "write_s": round(write_s, 2), "read_pool_s": round(read_s, 2),
            "file_mb": size, "file_mb_without_votes": size_rows_only, "votes_mb": round(size - size_rows_only, 1),
            "stored_rows": stored, "checksum": _checksum(dense)}


def bench_after(frame: pd.DataFrame, annotators: int, fired: float) -> dict:
    workdir = TMP / "after"
    shutil.rmtree(workdir, ignore_errors=True)
    store = Store.open(workdir)
    store.add_examples("bench", "synthetic", frame)
    size_rows_only = _checkpointed_mb(store, workdir)
    names = [f"{j:016x}" for j in range(annotators)]
    split_ids = {s: list(store.split_rows(s)[0]) for s in SPLITS}
    split_rows = {s: (frame["split"] == s).to_numpy() for s in SPLITS}
    started = time.perf_counter()
    for name, votes in zip(names, vote_columns(len(frame), annotators, fired), strict=True):
        for split in SPLITS:
            store.save_votes(name, split, split_ids[split], votes[split_rows[split]])
    write_s = time.perf_counter() - started
    size = _checkpointed_mb(store, workdir)
    Store.close_all()  # the read starts from a cold cache, as a fresh process would
    store = Store.open(workdir)
    started = time.perf_counter()
    dense = store.vote_matrix(names, "pool").votes
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    dense_again = store.vote_matrix(names, "pool").votes
    warm_s = time.perf_counter() - started
    assert np.array_equal(dense, dense_again)
    moving = [(i, 1, None) for i in split_ids["pool"][:100]]
    store.move_to_dev(moving, by="bench")
    started = time.perf_counter()
    after_move = store.vote_matrix(names, "pool").votes
    moved_s = time.perf_counter() - started
    assert after_move.shape[0] == dense.shape[0] - 100
    blobs = store._q("SELECT count(*), sum(octet_length(codes)) FROM vote_chunks")[0]
    Store.close_all()
    return {"format": "after: deflated int8 BLOB per annotator and 65,536 rows", "write_s": round(write_s, 2),
            "read_pool_s": round(read_s, 2), "read_pool_warm_s": round(warm_s, 2),
            "read_pool_after_move_s": round(moved_s, 2), "file_mb": size,
            "file_mb_without_votes": size_rows_only, "votes_mb": round(size - size_rows_only, 1),
            "stored_rows": int(blobs[0]),
            "blob_mb": round(int(blobs[1] or 0) / 2**20, 1), "checksum": _checksum(dense)}


def _checkpointed_mb(store: Store, workdir: Path) -> float:
    store._q("CHECKPOINT")
    return file_mb(workdir)


def _checksum(votes: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(votes, dtype=np.int32).tobytes()).hexdigest()[:16]


def markdown(records: list[dict], meta: dict) -> str:
    lines = ["# Vote storage: `bench/store_votes.py` (issue 15)\n",
             measured(meta) + f" {meta['annotators']} annotators, each firing on "
             f"{meta['fired']:.1%} of the rows; before = one row per vote on a bare DuckDB file with the same "
             "examples ids; after = the store. `votes MB` is what writing the votes added to the checkpointed "
             "file (the before file holds only ids and splits besides them, the after one the store's whole schema).\n",
             "| rows | format | write s | read pool s | votes MB (file growth) | file MB | stored rows | checksum |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['rows']:,} | {r['format']} | {r['write_s']} | {r['read_pool_s']} | {r['votes_mb']} "
                     f"| {r['file_mb']} | {r['stored_rows']:,} | `{r['checksum']}` |")
    lines.append("")
    for r in records:
        if "read_pool_warm_s" in r:
            lines.append(f"- {r['rows']:,} rows after: second read {r['read_pool_warm_s']} s (split rows cached), "
                         f"read after moving 100 rows into dev {r['read_pool_after_move_s']} s, BLOBs "
                         f"{r['blob_mb']} MB (deflated)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--annotators", type=int, default=50)
    parser.add_argument("--fired", type=float, default=0.077)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "store_votes")
    args = parser.parse_args()
    meta = {**run_meta("store_votes.py"), "annotators": args.annotators, "fired": args.fired}
    records = []
    for n in args.rows:
        frame = rows_frame(n)
        for fn in (bench_before, bench_after):
            record = {"rows": n, **fn(frame, args.annotators, args.fired)}
            records.append(record)
            print(json.dumps(record), flush=True)
        assert records[-1]["checksum"] == records[-2]["checksum"], "before and after read different votes"
    save_result(args.out, {"meta": meta, "records": records}, markdown(records, meta))
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
