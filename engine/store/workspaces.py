"""Workspaces on disk, as a set: which exist under a home folder, what each holds, rename, delete and restore.

A workspace is a folder holding `workspace.duckdb`. Deleting moves the folder into `<home>/.trash/` (a name no
workspace can take), so a delete can be undone until the trash is emptied by hand. A workspace another process
holds (a studio, an `evopool run`) is neither renamed nor deleted: DuckDB's file lock says so, and moving a file
under an open connection would leave that process writing into the trash.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from engine.store.workspace import DB_NAME, Store, WorkspaceLocked

TRASH = ".trash"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,59}$")


def default_home() -> Path:
    """Where workspaces live: $EVOPOOL_HOME, else ./workspaces."""
    return Path(os.environ.get("EVOPOOL_HOME") or Path.cwd() / "workspaces").resolve()


def check_name(name: str) -> str | None:
    """Why `name` cannot be a workspace name, or None when it can."""
    if not _NAME_OK.match(name or ""):
        return "use 1-60 letters, digits, '-', '_' or '.', starting with a letter or digit"
    return None


def names(home: Path) -> list[str]:
    """Every workspace under `home`, empty ones included, sorted (a picker keeps pointing at the same one)."""
    if not home.is_dir():
        return []
    return sorted(p.name for p in home.iterdir() if (p / DB_NAME).is_file() and not check_name(p.name))


@dataclass(frozen=True)
class Holding:
    """What a workspace holds, said before it is deleted. `rows` is None when another process holds the file."""

    name: str
    rows: int | None
    dev_rows: int | None
    generations: int | None
    pool: int | None
    expert_actions: int | None  # verdicts, edits and labels given by a person
    bytes_on_disk: int

    @property
    def empty(self) -> bool:
        return self.rows == 0

    def sentence(self) -> str:
        size = f"{self.bytes_on_disk / 1e6:.1f} MB on disk"
        if self.rows is None:
            return f"{self.name}: in use by another process · {size}"
        if not self.rows:
            return f"{self.name}: empty (no rows imported) · {size}"
        return (f"{self.name}: {self.rows:,} rows ({self.dev_rows:,} dev) · {self.generations} generation"
                f"{'' if self.generations == 1 else 's'} · {self.pool} annotator{'' if self.pool == 1 else 's'} "
                f"in the pool · {self.expert_actions:,} expert action{'' if self.expert_actions == 1 else 's'} "
                f"· {size}")


def holding(home: Path, name: str) -> Holding:
    """What `name` holds. Read through this process's open connection when there is one; otherwise the file is
    opened read-only for the moment of the count, so that listing never keeps another process out of it."""
    workdir = home / name
    size = sum(p.stat().st_size for p in workdir.iterdir() if p.is_file()) if workdir.is_dir() else 0
    path = str((workdir / DB_NAME).resolve())
    counts: tuple | None
    with Store._lock:  # no Store.open of the same file in this process meanwhile (DuckDB refuses mixed modes)
        if path in Store._connections:
            counts = _counts(Store._connections[path].cursor())
        else:
            try:
                conn = duckdb.connect(path, read_only=True)
            except duckdb.Error:  # locked by another process (or damaged): nothing to read
                counts = None
            else:
                try:
                    counts = _counts(conn)
                finally:
                    conn.close()
    if counts is None:
        return Holding(name, None, None, None, None, None, size)
    return Holding(name, *counts, bytes_on_disk=size)


def _counts(conn: duckdb.DuckDBPyConnection) -> tuple[int, int, int, int, int] | None:
    def one(sql: str) -> int:
        row = conn.execute(sql).fetchone()
        return int(row[0] or 0) if row else 0

    try:
        rows = one("SELECT count(*) FROM examples")
        if not rows:
            return 0, 0, 0, 0, 0
        dev = one("SELECT count(*) FROM examples WHERE split = 'dev'")
        generations = one("SELECT max(number) FROM generations WHERE status = 'complete'")
        pool = one("SELECT count(*) FROM (SELECT annotator_id, arg_max(verdict, seq) AS v FROM verdicts "
                   "GROUP BY annotator_id) WHERE v IN ('accept', 'approve')")
        human = one("SELECT count(*) FROM verdicts WHERE decided_by = 'human'")
    except duckdb.Error:  # a workspace from before a table existed, or a damaged one
        return None
    return rows, dev, generations, pool, human


def _under(home: Path, name: str) -> Path:
    """The folder of workspace `name` (a bare name: no '..' or '/' reaches outside `home`)."""
    if check_name(name):
        raise ValueError(f"bad workspace name {name!r}: {check_name(name)}")
    return home / name


def _release(workdir: Path) -> None:
    """Close this process's connection to the workspace, after checking no other process holds it."""
    path = workdir / DB_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no workspace at {workdir}")
    with Store._lock:
        held_here = str(path.resolve()) in Store._connections
        if not held_here:
            try:
                duckdb.connect(str(path), read_only=True).close()
            except duckdb.IOException as err:
                if "lock" in str(err).lower():
                    raise WorkspaceLocked(f"workspace {workdir.name} is in use by another process (a studio or an "
                                          "`evopool` run): close it there first") from err
                raise
    Store.close(workdir)


def rename(home: Path, old: str, new: str) -> Path:
    """Rename workspace `old` to `new`; returns its new folder."""
    problem = check_name(new)
    if problem:
        raise ValueError(f"bad workspace name {new!r}: {problem}")
    target = home / new
    if target.exists():
        raise FileExistsError(f"a workspace (or folder) named {new!r} already exists in {home}")
    _release(_under(home, old))
    (home / old).rename(target)
    return target


def delete(home: Path, name: str) -> Path:
    """Move workspace `name` into the trash; returns where it went (give it to `restore` to undo)."""
    _release(_under(home, name))
    trash = home / TRASH
    trash.mkdir(exist_ok=True)
    target = trash / f"{name}@{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 1_000_000:06d}"
    (home / name).rename(target)
    return target


def trashed(home: Path, name: str | None = None) -> list[Path]:
    """Deleted workspaces still in the trash (of `name`, or all), newest first."""
    trash = home / TRASH
    if not trash.is_dir():
        return []
    found = [p for p in trash.iterdir() if (p / DB_NAME).is_file() and (name is None or
                                                                          p.name.rsplit("@", 1)[0] == name)]
    return sorted(found, key=lambda p: p.name.rsplit("@", 1)[-1], reverse=True)


def restore(home: Path, deleted: Path) -> str:
    """Bring a deleted workspace back under its name; returns the name."""
    name = deleted.name.rsplit("@", 1)[0]
    if (home / name).exists():
        raise FileExistsError(f"a workspace named {name!r} exists again; rename it before restoring the deleted one")
    deleted.rename(home / name)
    return name


def empty_trash(home: Path) -> int:
    """Delete the trash for good; returns how many workspaces it held."""
    held = trashed(home)
    shutil.rmtree(home / TRASH, ignore_errors=True)
    return len(held)
