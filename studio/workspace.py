"""Workspaces on disk: where they live, which exist, opening one, and the one-click demo.

A workspace is a folder holding `workspace.duckdb` under `$EVOPOOL_HOME` (default `./workspaces`).
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from engine.ingest.importer import ImportReport, IngestOptions, import_path
from engine.store import workspaces
from engine.store.workspace import DB_NAME, Store, WorkspaceUnavailable

ROOT = Path(__file__).resolve().parents[1]
DEMO_CSV = ROOT / "data" / "demo" / "youtube_spam.csv"
DEMO_NAME = "youtube-spam-demo"
DEMO_INSTRUCTIONS = ("Label each YouTube comment: SPAM if it promotes something (a channel, a link, a product, "
                     "asks to subscribe or check out a video), HAM if it is a genuine comment on the video.")
DEMO_DESCRIPTIONS = {"HAM": "a genuine comment about the video or song",
                     "SPAM": "self-promotion, links, requests to subscribe or visit something"}


def home() -> Path:
    """Where workspaces live: $EVOPOOL_HOME, else ./workspaces (created on first use)."""
    return workspaces.default_home()


def check_name(name: str) -> str | None:
    """Why `name` cannot be a workspace name, or None when it can."""
    return workspaces.check_name(name)


def workdir(name: str) -> Path:
    return home() / name


def list_workspaces(empty_too: bool = False) -> list[str]:
    """Existing workspaces, by name, in a stable order (a picker keeps pointing at the same one). Empty ones (a
    workspace created, then an upload that failed) only with `empty_too`: the picker is for work, not leftovers."""
    found = workspaces.names(home())
    return found if empty_too else [n for n in found if not holding(n).empty]


def holding(name: str) -> workspaces.Holding:
    """What a workspace holds (rows, generations, expert actions, size), cached until its files change."""
    folder = workdir(name)
    stats = ((p.name, p.stat()) for p in sorted(folder.iterdir()) if p.is_file()) if folder.is_dir() else ()
    stamp = tuple((file, stat.st_mtime_ns, stat.st_size) for file, stat in stats)
    return _holding(str(home()), name, stamp)


@st.cache_data(show_spinner=False, max_entries=256)
def _holding(home_dir: str, name: str, stamp: tuple) -> workspaces.Holding:
    return workspaces.holding(Path(home_dir), name)


def exists(name: str) -> bool:
    return (workdir(name) / DB_NAME).is_file()


def open_store(name: str) -> Store:
    """Open (creating if needed) a workspace. Store.open caches one connection per file per process."""
    if check_name(name):
        raise ValueError(f"bad workspace name {name!r}: {check_name(name)}")
    return Store.open(workdir(name))


def fresh_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`… whichever is not a workspace with data yet."""
    name, n = base, 1
    while exists(name) and _taken(name):
        n += 1
        name = f"{base}-{n}"
    return name


def _taken(name: str) -> bool:
    """Whether an existing workspace is no place for a fresh import: it holds data, or another process has it."""
    try:
        return open_store(name).has_data()
    except WorkspaceUnavailable:  # another process has it, or it is damaged: not to be overwritten
        return True


def demo_options() -> IngestOptions:
    """How the demo is imported: its task name, instructions and label descriptions."""
    return IngestOptions(dev_size=500, instructions=DEMO_INSTRUCTIONS, label_descriptions=DEMO_DESCRIPTIONS,
                         task_name="YouTube comment spam")


def load_demo() -> tuple[str, ImportReport]:
    """Import the bundled YouTube spam demo (CC BY 4.0) into a fresh workspace; returns its name."""
    name = fresh_name(DEMO_NAME)
    created = not exists(name)
    try:
        report = import_path(open_store(name), DEMO_CSV, demo_options())
    except Exception:
        if created:  # a failed import leaves no empty workspace behind in the list
            Store.discard_empty(workdir(name))
        raise
    return name, report


@st.cache_data(show_spinner=False, max_entries=64)
def _summary(name: str, version: tuple) -> dict:
    store = open_store(name)
    task = store.find_task()
    return {"rows": store.count_examples(), "splits": store.split_counts(),
            "labels": list(task.labels) if task else [], "task": task.name if task else "",
            "generation": store.last_complete_generation(), "pool": len(store.pool_ids())}


def summary(name: str) -> dict:
    """Small facts about a workspace for the sidebar (cached until its pool or generation changes)."""
    store = open_store(name)
    return _summary(name, version(store))


def version(store: Store) -> tuple:
    """A cheap token that changes whenever verdicts, generations or the data change: the cache key. The verdicts: the
    last one's number (their count per annotator comes back after an undo or a reject then approve). The data:
    `rows_version`, which every import and every move of rows between splits rewrites (dev's count alone can come
    back with other rows after an undo). The pool is read off the verdicts, so their number covers it."""
    return store.rows_version(), store.last_complete_generation(), store.verdicts_version()
