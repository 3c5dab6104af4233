"""The DuckDB workspace: the only module (with migrations.py) that imports duckdb.

One file per workspace. Every stage writes what it produces as it produces it; a generation's
verdicts and its `complete` status are written in one transaction, so a killed run never leaves
a half-decided generation behind.

DuckDB allows one read-write process per file. Within a process, `Store.open` hands out one
shared connection per path and each thread gets its own cursor, so the studio's background jobs
and its pages can share a workspace.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import numpy as np
import pandas as pd

from engine.migrations import MIGRATIONS
from engine.types import (
    ABSTAIN,
    AUDIT,
    FITNESS,
    SPLITS,
    Annotator,
    AnnotatorScore,
    Example,
    GateDecision,
    Task,
    VoteMatrix,
)

DB_NAME = "workspace.duckdb"
IN_POOL_VERDICTS = ("accept", "approve")


class WorkspaceLocked(RuntimeError):
    """Another process (often a running studio) holds the workspace file."""


def _split_filter(split: str) -> tuple[str, list[Any]]:
    """SQL condition for a split, or for one of dev's two row sets: `fitness` (what the agents and the gate
    see) and `audit` (held back from them, so aggregator choice on those rows is honest)."""
    if split == FITNESS:
        return "split = 'dev' AND NOT audit", []
    if split == AUDIT:
        return "split = 'dev' AND audit", []
    return "split = ?", [split]


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Store:
    _connections: dict[str, duckdb.DuckDBPyConnection] = {}
    _lock = threading.Lock()

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path):
        self._conn = conn
        self.path = path
        self._local = threading.local()

    # ---- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, workdir: str | Path) -> "Store":
        """Open (creating and migrating if needed) the workspace in `workdir`."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        path = (workdir / DB_NAME).resolve()
        with cls._lock:
            conn = cls._connections.get(str(path))
            if conn is None:
                try:
                    conn = duckdb.connect(str(path))
                except duckdb.IOException as err:
                    raise WorkspaceLocked(
                        f"workspace {path} is in use by another process (close the studio or the "
                        f"other `evopool` run first): {err}"
                    ) from err
                cls._connections[str(path)] = conn
                store = cls(conn, path)
                store._migrate()
        return cls(conn, path)

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            for conn in cls._connections.values():
                conn.close()
            cls._connections.clear()

    @property
    def _cur(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._conn.cursor()
            self._local.cur = cur
        return cur

    def _migrate(self) -> None:
        cur = self._conn.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS _migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
        done = {row[0] for row in cur.execute("SELECT name FROM _migrations").fetchall()}
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            cur.execute("BEGIN TRANSACTION")
            cur.execute(sql)
            cur.execute("INSERT INTO _migrations VALUES (?, ?)", [name, _now()])
            cur.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        cur = self._cur
        cur.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _q(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        return self._cur.execute(sql, params or []).fetchall()

    def _df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        return self._cur.execute(sql, params or []).df()

    # ---- meta --------------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._q("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, json.dumps(value)])

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._q("SELECT value FROM meta WHERE key = ?", [key])
        return json.loads(rows[0][0]) if rows else default

    # ---- task and examples -------------------------------------------------------------------
    def save_task(self, task: Task) -> None:
        with self.transaction():
            self._q("DELETE FROM task")
            self._q(
                "INSERT INTO task VALUES (?, ?, ?, ?, ?, ?)",
                [task.name, json.dumps(list(task.labels)), json.dumps(dict(task.label_descriptions)),
                 task.instructions, json.dumps(list(task.fields)), task.multi_label],
            )

    def load_task(self) -> Task | None:
        rows = self._q("SELECT * FROM task")
        if not rows:
            return None
        name, labels, descs, instructions, fields, multi = rows[0]
        return Task(name, tuple(json.loads(labels)), json.loads(descs), instructions,
                    tuple(json.loads(fields)), bool(multi))

    def has_data(self) -> bool:
        return self._q("SELECT count(*) FROM examples")[0][0] > 0

    def add_examples(self, dataset: str, source: str, frame: pd.DataFrame) -> None:
        """Insert a validated frame with columns id, text, fields (dict), split, label (int or NA) and, for a
        multi-label task, label_set (list of ints or None).

        All or nothing: one transaction.
        """
        sets = frame["label_set"] if "label_set" in frame else [None] * len(frame)
        rows = pd.DataFrame({
            "id": frame["id"].astype(str),
            "ord": np.arange(len(frame), dtype=np.int64) + self.count_examples(),
            "text": frame["text"].astype(str),
            "fields": [json.dumps(f, ensure_ascii=False, default=str) for f in frame["fields"]],
            "split": frame["split"].astype(str),
            "label": pd.array(frame["label"], dtype="Int64"),
            "dataset": dataset,
            "audit": frame["audit"].astype(bool) if "audit" in frame else False,
            "label_set": pd.Series([json.dumps([int(c) for c in s]) if isinstance(s, (list, tuple)) else None
                                    for s in sets], dtype="string"),
        })
        with self.transaction():
            self._cur.register("incoming_rows", rows)
            self._q("INSERT INTO examples (id, ord, text, fields, split, label, dataset, audit, label_set) "
                    "SELECT id, ord, text, fields, split, label, dataset, audit, "
                    "CAST(from_json(label_set, '[\"INTEGER\"]') AS INTEGER[]) FROM incoming_rows")
            self._cur.unregister("incoming_rows")
            self._q("INSERT OR REPLACE INTO datasets VALUES (?, ?, ?, ?)", [dataset, source, _now(), len(rows)])

    def count_examples(self, split: str | None = None) -> int:
        if split is None:
            return self._q("SELECT count(*) FROM examples")[0][0]
        where, params = _split_filter(split)
        return self._q(f"SELECT count(*) FROM examples WHERE {where}", params)[0][0]

    def split_counts(self) -> dict[str, int]:
        return dict(self._q("SELECT split, count(*) FROM examples GROUP BY split ORDER BY split"))

    def examples_frame(self, split: str | None = None, ids: Sequence[str] | None = None,
                       limit: int | None = None, offset: int = 0) -> pd.DataFrame:
        """Rows as a frame (id, text, fields as dict, split, label, audit, label_set), in import order.

        label_set is a tuple of class ids on multi-label rows, None elsewhere."""
        where, params = [], []
        if split is not None:
            clause, values = _split_filter(split)
            where.append(clause)
            params.extend(values)
        if ids is not None:
            where.append("id IN (SELECT unnest(?))")
            params.append(list(ids))
        sql = "SELECT id, text, fields, split, label, audit, label_set FROM examples"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY ord"
        if limit is not None:
            sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
        frame = self._df(sql, params)
        frame["fields"] = [json.loads(f) if f else {} for f in frame["fields"]]
        frame["label"] = frame["label"].astype("Int64")
        frame["audit"] = frame["audit"].fillna(False).astype(bool)
        frame["label_set"] = pd.Series([tuple(int(c) for c in s) if isinstance(s, (list, np.ndarray)) else None
                                        for s in frame["label_set"]], index=frame.index, dtype=object)
        return frame

    def examples(self, split: str | None = None, ids: Sequence[str] | None = None) -> list[Example]:
        frame = self.examples_frame(split, ids)
        return [
            Example(r.id, r.text, r.split, None if pd.isna(r.label) else int(r.label), r.fields)
            for r in frame.itertuples(index=False)
        ]

    # ---- annotators, scores ------------------------------------------------------------------
    def save_annotator(self, a: Annotator) -> None:
        """Idempotent: the id is the code hash, so re-saving the same code is a no-op."""
        if self._q("SELECT 1 FROM annotators WHERE id = ?", [a.id]):
            return
        self._q(
            "INSERT INTO annotators VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [a.id, a.name, a.source, a.agent, a.generation, json.dumps(list(a.parent_ids)), a.author,
             a.rationale, _now()],
        )

    @staticmethod
    def _annotator(row: tuple) -> Annotator:
        id_, name, source, agent, generation, parents, author, rationale = row[:8]
        return Annotator(id_, name, source, agent, int(generation), tuple(json.loads(parents)), author,
                         rationale or "")

    _ANN_COLS = "id, name, source, agent, generation, parent_ids, author, rationale"

    def annotator(self, annotator_id: str) -> Annotator | None:
        rows = self._q(f"SELECT {self._ANN_COLS} FROM annotators WHERE id = ?", [annotator_id])
        return self._annotator(rows[0]) if rows else None

    def annotators(self, ids: Sequence[str] | None = None, generation: int | None = None) -> list[Annotator]:
        sql, params = f"SELECT {self._ANN_COLS} FROM annotators", []
        if ids is not None:
            sql += " WHERE id IN (SELECT unnest(?))"
            params.append(list(ids))
        elif generation is not None:
            sql += " WHERE generation = ?"
            params.append(generation)
        rows = self._q(sql + " ORDER BY created_at, id", params)
        found = {r[0]: self._annotator(r) for r in rows}
        return [found[i] for i in ids if i in found] if ids is not None else list(found.values())

    def children_of(self, annotator_id: str) -> list[Annotator]:
        rows = self._q(f"SELECT {self._ANN_COLS} FROM annotators WHERE list_contains(from_json(parent_ids, "
                       f"'[\"VARCHAR\"]'), ?) ORDER BY created_at", [annotator_id])
        return [self._annotator(r) for r in rows]

    def save_score(self, s: AnnotatorScore) -> None:
        self._q("INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?, ?, ?)",
                [s.annotator_id, s.fires, s.coverage, s.precision, s.label, s.correct, s.faults])

    def scores(self, ids: Sequence[str] | None = None) -> dict[str, AnnotatorScore]:
        sql, params = "SELECT * FROM scores", []
        if ids is not None:
            sql += " WHERE annotator_id IN (SELECT unnest(?))"
            params.append(list(ids))
        return {r[0]: AnnotatorScore(r[0], int(r[1]), float(r[2]), float(r[3]), int(r[4]), int(r[5]), int(r[6]))
                for r in self._q(sql, params)}

    # ---- votes -------------------------------------------------------------------------------
    def save_votes(self, annotator_id: str, split: str, example_ids: Sequence[str], votes: np.ndarray,
                   faults: int = 0, first_error: str | None = None, seconds: float = 0.0) -> None:
        """Store one annotator's votes on one split (sparse: abstains are not rows)."""
        if split not in SPLITS:
            raise ValueError(f"votes are stored per split ({', '.join(SPLITS)}), not per {split!r}")
        votes = np.asarray(votes)
        fired = votes != ABSTAIN
        rows = pd.DataFrame({"annotator_id": annotator_id,
                             "example_id": np.asarray(example_ids, dtype=object)[fired],
                             "vote": votes[fired].astype(np.int32)})
        with self.transaction():
            self._q("DELETE FROM votes WHERE annotator_id = ? AND example_id IN "
                    "(SELECT id FROM examples WHERE split = ?)", [annotator_id, split])
            self._cur.register("incoming_votes", rows)
            self._q("INSERT INTO votes SELECT annotator_id, example_id, vote FROM incoming_votes")
            self._cur.unregister("incoming_votes")
            self._q("INSERT OR REPLACE INTO vote_runs VALUES (?, ?, ?, ?, ?, ?)",
                    [annotator_id, split, len(votes), faults, first_error, seconds])

    def voted_splits(self, annotator_id: str) -> dict[str, dict]:
        rows = self._q("SELECT split, n, faults, first_error, seconds FROM vote_runs WHERE annotator_id = ?",
                       [annotator_id])
        return {r[0]: {"n": r[1], "faults": r[2], "first_error": r[3], "seconds": r[4]} for r in rows}

    def vote_matrix(self, annotator_ids: Sequence[str], split: str | None = None,
                    example_ids: Sequence[str] | None = None) -> VoteMatrix:
        """Dense (n_examples, n_annotators) votes, rows in import order (or in `example_ids` order)."""
        if example_ids is None:
            example_ids = self.example_ids(split)
        example_ids = list(example_ids)
        annotator_ids = list(annotator_ids)
        dense = np.full((len(example_ids), len(annotator_ids)), ABSTAIN, dtype=np.int32)
        if annotator_ids and example_ids:
            clause, values = _split_filter(split) if split else ("", [])
            sparse = self._df(
                "SELECT annotator_id, example_id, vote FROM votes WHERE annotator_id IN (SELECT unnest(?))"
                + (f" AND example_id IN (SELECT id FROM examples WHERE {clause})" if split else ""),
                [annotator_ids] + values,
            )
            row_of = pd.Series(np.arange(len(example_ids)), index=pd.Index(example_ids))
            col_of = pd.Series(np.arange(len(annotator_ids)), index=pd.Index(annotator_ids))
            sparse = sparse[sparse["example_id"].isin(row_of.index)]
            dense[row_of[sparse["example_id"]].to_numpy(), col_of[sparse["annotator_id"]].to_numpy()] = (
                sparse["vote"].to_numpy())
        return VoteMatrix(dense, tuple(example_ids), tuple(annotator_ids))

    def example_ids(self, split: str | None = None) -> list[str]:
        if split is None:
            return [r[0] for r in self._q("SELECT id FROM examples ORDER BY ord")]
        where, params = _split_filter(split)
        return [r[0] for r in self._q(f"SELECT id FROM examples WHERE {where} ORDER BY ord", params)]

    def labels(self, split: str) -> np.ndarray:
        """Gold class indices of a split, import order; -1 where unknown."""
        where, params = _split_filter(split)
        rows = self._q(f"SELECT coalesce(label, -1) FROM examples WHERE {where} ORDER BY ord", params)
        return np.array([r[0] for r in rows], dtype=np.int64)

    def label_matrix(self, split: str) -> np.ndarray:
        """Gold label sets of a split as (n, k) 0/1, import order; all-zero rows where unknown.

        Single-label rows (no label_set) give a one-hot row of their label.
        """
        k = len(self.load_task().labels)
        where, params = _split_filter(split)
        rows = self._q(f"SELECT label, label_set FROM examples WHERE {where} ORDER BY ord", params)
        out = np.zeros((len(rows), k), dtype=np.int64)
        for i, (label, label_set) in enumerate(rows):
            members = label_set if label_set is not None else ([] if label is None else [label])
            out[i, members] = 1
        return out

    def gold(self, split: str) -> np.ndarray:
        """What scoring compares votes with: (n,) class ids, or (n, k) 0/1 label sets on a multi-label task."""
        task = self.load_task()
        return self.label_matrix(split) if task is not None and task.multi_label else self.labels(split)

    # ---- generations and verdicts ------------------------------------------------------------
    def last_complete_generation(self) -> int:
        rows = self._q("SELECT max(number) FROM generations WHERE status = 'complete'")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def start_generation(self, number: int) -> None:
        self._q("DELETE FROM generations WHERE number = ? AND status <> 'complete'", [number])
        self._q("INSERT INTO generations (number, status, started_at) VALUES (?, 'running', ?)", [number, _now()])

    def complete_generation(self, number: int, decisions: Sequence[GateDecision], *, f1_before: float,
                            f1_after: float, n_candidates: int, pool_size: int, reverted: bool,
                            seconds: float) -> None:
        """Write a generation's verdicts and mark it complete, atomically."""
        n_accepted = sum(d.verdict == "accept" for d in decisions)
        with self.transaction():
            for d in decisions:
                self._insert_verdict(d, number)
            self._q(
                "UPDATE generations SET status = 'complete', finished_at = ?, dev_macro_f1_before = ?, "
                "dev_macro_f1_after = ?, n_candidates = ?, n_accepted = ?, pool_size = ?, reverted = ?, "
                "seconds = ? WHERE number = ?",
                [_now(), f1_before, f1_after, n_candidates, n_accepted, pool_size, reverted, seconds, number],
            )

    def _insert_verdict(self, d: GateDecision, generation: int) -> None:
        self._q(
            "INSERT INTO verdicts (annotator_id, generation, verdict, reasons, decided_by, note, recorded_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [d.annotator_id, generation, d.verdict, json.dumps(list(d.reasons)), d.decided_by, d.note, _now()],
        )

    def record_human_verdict(self, annotator_id: str, verdict: str, note: str) -> None:
        """An expert's approve / reject: stored, and respected by every later generation."""
        if verdict not in ("approve", "reject"):
            raise ValueError(f"a human verdict is 'approve' or 'reject', not {verdict!r}")
        if not note.strip():
            raise ValueError("a human verdict needs a reason")
        self._insert_verdict(GateDecision(annotator_id, verdict, (), "human", note.strip()),
                             self.last_complete_generation())

    def generations(self) -> pd.DataFrame:
        return self._df("SELECT * FROM generations ORDER BY number")

    def verdicts(self, annotator_id: str | None = None, generation: int | None = None) -> pd.DataFrame:
        sql, params, where = "SELECT * FROM verdicts", [], []
        if annotator_id is not None:
            where.append("annotator_id = ?")
            params.append(annotator_id)
        if generation is not None:
            where.append("generation = ?")
            params.append(generation)
        if where:
            sql += " WHERE " + " AND ".join(where)
        frame = self._df(sql + " ORDER BY seq", params)
        frame["reasons"] = [json.loads(r) for r in frame["reasons"]]
        return frame

    def latest_verdicts(self) -> dict[str, tuple[str, str]]:
        """annotator id -> (verdict, decided_by) of its most recent verdict."""
        rows = self._q("SELECT annotator_id, arg_max(verdict, seq), arg_max(decided_by, seq) FROM verdicts "
                       "GROUP BY annotator_id")
        return {r[0]: (r[1], r[2]) for r in rows}

    def human_locked(self) -> dict[str, str]:
        """Annotators whose latest verdict is a human's: id -> 'approve' | 'reject'. The gate leaves them be."""
        return {a: v for a, (v, by) in self.latest_verdicts().items() if by == "human"}

    def pool_ids(self) -> list[str]:
        """The current pool: annotators whose latest verdict puts them in it, oldest first."""
        rows = self._q(
            "SELECT v.annotator_id FROM (SELECT annotator_id, arg_max(verdict, seq) AS verdict, min(seq) AS first "
            "FROM verdicts GROUP BY annotator_id) v WHERE v.verdict IN ('accept', 'approve') ORDER BY v.first"
        )
        return [r[0] for r in rows]

    # ---- events (live progress) --------------------------------------------------------------
    def add_event(self, run_id: str, kind: str, payload: dict) -> None:
        self._q("INSERT INTO events (run_id, recorded_at, kind, payload) VALUES (?, ?, ?, ?)",
                [run_id, _now(), kind, json.dumps(payload, default=str)])

    def events(self, run_id: str | None = None, after_seq: int = 0, limit: int = 500) -> list[dict]:
        sql, params = "SELECT seq, run_id, recorded_at, kind, payload FROM events WHERE seq > ?", [after_seq]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._q(sql + f" ORDER BY seq LIMIT {int(limit)}", params)
        return [{"seq": r[0], "run_id": r[1], "at": r[2], "kind": r[3], **json.loads(r[4])} for r in rows]

    # ---- LLM call log and cache --------------------------------------------------------------
    def record_llm_call(self, *, request_hash: str, role: str, model: str, prompt_hash: str, request: str,
                        reply: str | None, tokens_in: int, tokens_out: int, latency_s: float,
                        cost_usd: float, error: str | None = None) -> None:
        self._q("INSERT INTO llm_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [request_hash, role, model, prompt_hash, request, reply, tokens_in, tokens_out, latency_s,
                 cost_usd, error, _now()])

    def cached_llm_reply(self, request_hash: str) -> str | None:
        rows = self._q("SELECT reply FROM llm_calls WHERE request_hash = ? AND error IS NULL AND reply IS NOT NULL "
                       "ORDER BY recorded_at LIMIT 1", [request_hash])
        return rows[0][0] if rows else None

    def llm_calls(self) -> pd.DataFrame:
        return self._df("SELECT * FROM llm_calls ORDER BY recorded_at")

    # ---- embeddings cache --------------------------------------------------------------------
    def cached_embeddings(self, model: str, text_hashes: Sequence[str]) -> dict[str, np.ndarray]:
        frame = self._df("SELECT text_hash, vector FROM embeddings WHERE model = ? AND text_hash IN "
                         "(SELECT unnest(?))", [model, list(text_hashes)])
        return {h: np.asarray(v, dtype=np.float32) for h, v in zip(frame["text_hash"], frame["vector"], strict=False)}

    def save_embeddings(self, model: str, text_hashes: Sequence[str], vectors: np.ndarray) -> None:
        rows = pd.DataFrame({"model": model, "text_hash": list(text_hashes),
                             "vector": [v.astype(np.float32).tolist() for v in vectors]})
        with self.transaction():
            self._cur.register("incoming_vectors", rows)
            self._q("INSERT OR IGNORE INTO embeddings SELECT model, text_hash, vector::FLOAT[] FROM incoming_vectors")
            self._cur.unregister("incoming_vectors")

    # ---- jobs --------------------------------------------------------------------------------
    def upsert_job(self, job_id: str, **values: Any) -> None:
        if not self._q("SELECT 1 FROM jobs WHERE id = ?", [job_id]):
            self._q("INSERT INTO jobs (id, started_at) VALUES (?, ?)", [job_id, _now()])
        for key, value in values.items():
            if key not in {"kind", "status", "params", "progress", "message", "finished_at", "error"}:
                raise KeyError(key)
            if key == "params":
                value = json.dumps(value)
            self._q(f"UPDATE jobs SET {key} = ? WHERE id = ?", [value, job_id])

    def jobs(self) -> pd.DataFrame:
        return self._df("SELECT * FROM jobs ORDER BY started_at DESC")
