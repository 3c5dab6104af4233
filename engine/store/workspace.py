"""The DuckDB workspace: the only module (with migrations.py) that imports duckdb.

One file per workspace. Every stage writes what it produces as it produces it; a generation's
verdicts and its `complete` status are written in one transaction, so a killed run never leaves
a half-decided generation behind.

DuckDB allows one read-write process per file. Within a process, `Store.open` hands out one
shared connection per path and each thread gets its own cursor, so the studio's background jobs
and its pages can share a workspace.

`Store` itself holds the connection, the migrations, the SQL helpers (`_q`, `_df`, `transaction`) and the
meta table; what it stores is read and written by mixins that never touch duckdb: `ExamplesMixin`
(`examples.py`: task, examples, gold labels, which rows each split holds), `PoolMixin` (`pool.py`:
annotators, scores, votes packed by `vote_codes.py`, generations, verdicts) and `LogsMixin` (`logs.py`:
events, LLM calls, embeddings, jobs).
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import pandas as pd

from engine.store.examples import ExamplesMixin
from engine.store.logs import LogsMixin
from engine.store.migrations import MIGRATIONS
from engine.store.pool import PoolMixin
from engine.store.sql import utc_now

DB_NAME = "workspace.duckdb"


class WorkspaceUnavailable(RuntimeError):
    """The workspace file cannot be opened."""


class WorkspaceLocked(WorkspaceUnavailable):
    """Another process (often a running studio) holds the workspace file."""


class WorkspaceDamaged(WorkspaceUnavailable):
    """The workspace file is not a readable DuckDB database (truncated, overwritten)."""


def _damaged(path: Path, err: Exception) -> WorkspaceDamaged:
    return WorkspaceDamaged(f"cannot open workspace {path}: the file is damaged or not a workspace ({err}); restore "
                            "it from a copy or use another --workdir")


_WRITES = ("INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP")


class Store(ExamplesMixin, PoolMixin, LogsMixin):
    _connections: dict[str, duckdb.DuckDBPyConnection] = {}
    _write_locks: dict[str, threading.RLock] = {}
    _lock = threading.Lock()  # guards _connections (held while a new store migrates)
    _write_locks_guard = threading.Lock()

    def __init__(self, conn: duckdb.DuckDBPyConnection, path: Path):
        self._conn = conn
        self.path = path
        self._local = threading.local()
        # one writer at a time per workspace in this process: a background job and the studio write the same rows
        # (a candidate's votes, scores), and DuckDB refuses the second of two overlapping writes ("Conflict on
        # update"), failing the run or the expert's save. Reads take no lock.
        with Store._write_locks_guard:
            self._writing = Store._write_locks.setdefault(str(path), threading.RLock())

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
                    if "lock" in str(err).lower():  # DuckDB: "Could not set lock on file ..."
                        raise WorkspaceLocked(
                            f"workspace {path} is in use by another process (close the studio or the "
                            f"other `evopool` run first): {err}"
                        ) from err
                    raise _damaged(path, err) from err
                try:  # a truncated file may connect and fail on its first read
                    cls(conn, path)._migrate()
                except duckdb.IOException as err:
                    conn.close()
                    raise _damaged(path, err) from err
                cls._connections[str(path)] = conn
        return cls(conn, path)

    @classmethod
    def discard_empty(cls, workdir: str | Path) -> bool:
        """Close and delete a workspace that holds no rows (one a failed first import created); a workspace with
        data is never touched. Returns whether it was deleted."""
        workdir = Path(workdir)
        path = (workdir / DB_NAME).resolve()
        if not path.is_file() or cls.open(workdir).has_data():
            return False
        cls.close(workdir)
        for leftover in workdir.iterdir():
            if leftover.is_file() and leftover.name.startswith(DB_NAME):  # the file and its .wal
                leftover.unlink()
        if not any(workdir.iterdir()):
            workdir.rmdir()
        return True

    @classmethod
    def close(cls, workdir: str | Path) -> None:
        """Close this process's connection to the workspace in `workdir` (before it is moved or deleted)."""
        path = (Path(workdir) / DB_NAME).resolve()
        with cls._lock:
            conn = cls._connections.pop(str(path), None)
            if conn is not None:
                conn.close()
            cls.forget_split_rows(str(path))

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            for conn in cls._connections.values():
                conn.close()
            cls._connections.clear()
            cls.forget_split_rows()

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
            if callable(sql):
                sql(cur)
            else:
                cur.execute(sql)
            cur.execute("INSERT INTO _migrations VALUES (?, ?)", [name, utc_now()])
            cur.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All or nothing, and the workspace's only writer in this process until it ends."""
        with self._writing:
            cur = self._cur
            cur.execute("BEGIN TRANSACTION")
            try:
                yield
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _q(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        if sql.split(None, 1)[0].upper() in _WRITES:
            with self._writing:
                return self._cur.execute(sql, params or []).fetchall()
        return self._cur.execute(sql, params or []).fetchall()

    def _df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        return self._cur.execute(sql, params or []).df()

    # ---- meta --------------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._q("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, json.dumps(value)])

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._q("SELECT value FROM meta WHERE key = ?", [key])
        return json.loads(rows[0][0]) if rows else default
