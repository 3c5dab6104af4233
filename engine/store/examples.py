"""The workspace's rows: the task, the imported examples, and the gold labels scoring compares with.

`ExamplesMixin` is one part of `engine.store.workspace.Store`, kept apart so the store module itself stays about opening
and migrating the DuckDB file. It holds no connection of its own: it runs SQL through the host's `_q`, `_df`,
`_cur` and `transaction`, filters splits with `store_sql.split_filter` and stamps rows with `store_sql.utc_now`,
so it never imports duckdb. Rows keep their import order (`ord`); the `fitness` and `audit` pseudo-splits are dev's two
row sets.

Every change to which rows exist or which split they are in (an import, the expert moving rows into dev) writes a
fresh `rows_version` token in the same transaction; `split_rows` caches each split's ids and places under that
token, so a cached row order never outlives the splits it was read from (a rolled-back change's token is never
seen again, which a counter could not promise).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Sequence

import numpy as np
import pandas as pd

from engine.domain import Example, Task
from engine.store.actor import acting_expert
from engine.store.base import StoreBase
from engine.store.sql import split_filter, utc_now

ROWS_VERSION = "rows_version"  # meta key: a fresh token whenever rows are added or change split


class ExamplesMixin(StoreBase):
    """Task, examples and label matrices of a workspace (mixed into `engine.store.workspace.Store`)."""

    # workspace path -> (rows_version token, {("split", name): (ids, ords), "index": (id index, ords)});
    # shared by every Store on that file
    _split_rows_cache: dict[str, tuple[str | None, dict]] = {}

    # ---- task and examples -------------------------------------------------------------------
    def save_task(self, task: Task) -> None:
        with self.transaction():
            self._write_task(task)

    def _write_task(self, task: Task) -> None:
        self._q("DELETE FROM task")
        self._q(
            "INSERT INTO task VALUES (?, ?, ?, ?, ?, ?)",
            [task.name, json.dumps(list(task.labels)), json.dumps(dict(task.label_descriptions)),
             task.instructions, json.dumps(list(task.fields)), task.multi_label],
        )

    def describe_label(self, label: str, description: str) -> str:
        """Set one label's description (blank: remove it) and return the one it replaces ("" when none). The agents
        read descriptions from the next generation on: the offline agents seed cues from their words, the LLM
        agents' prompts quote them."""
        task = self.find_task()
        if task is None:
            raise ValueError("this workspace has no task yet: import data first")
        task.check_label(label)
        descriptions = dict(task.label_descriptions)
        previous = str(descriptions.pop(label, ""))
        if description.strip():
            descriptions[label] = description.strip()
        with self.transaction():
            self._write_task(replace(task, label_descriptions={k: descriptions[k] for k in task.labels
                                                               if k in descriptions}))
            self._q("INSERT INTO label_descriptions_log VALUES (?, ?, ?, ?, ?)",
                    [label, description.strip(), previous, acting_expert(), utc_now()])
        return previous

    def description_log(self) -> pd.DataFrame:
        """Every description given to a label after import: label, description, previous, expert, recorded_at."""
        return self._df("SELECT * FROM label_descriptions_log ORDER BY recorded_at")

    def load_task(self) -> Task:
        """The workspace's task; LookupError before any data was imported (`find_task` answers None then)."""
        task = self.find_task()
        if task is None:
            raise LookupError("this workspace has no task yet: import data first")
        return task

    def find_task(self) -> Task | None:
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
            self._q("INSERT OR REPLACE INTO datasets VALUES (?, ?, ?, ?)", [dataset, source, utc_now(), len(rows)])
            self._bump_rows_version()

    def move_to_dev(self, labeled: Sequence[tuple[str, int, Sequence[int] | None]], by: str, note: str = "") -> int:
        """Give unlabeled pool rows the expert's label and move them into dev's fitness rows, recording who and
        when in `expert_labels`. `labeled`: (example id, class id, class ids of a multi-label set or None).
        Rows not in the pool (dev, test, unknown) are left alone. Returns how many rows moved; all or nothing."""
        ids = [str(i) for i, _, _ in labeled]
        in_pool = {r[0] for r in self._q("SELECT id FROM examples WHERE split = 'pool' AND id IN (SELECT unnest(?))",
                                         [ids])}
        now = utc_now()
        with self.transaction():
            for example_id, label, label_set in labeled:
                if str(example_id) not in in_pool:
                    continue
                members = [int(c) for c in label_set] if label_set is not None else None
                self._q("UPDATE examples SET split = 'dev', audit = FALSE, label = ?, label_set = ? WHERE id = ?",
                        [int(label), members, str(example_id)])
                self._q("INSERT OR REPLACE INTO expert_labels VALUES (?, ?, ?, ?, ?, 'pool', ?)",
                        [str(example_id), int(label), members, by, now, note])
            if in_pool:
                self._bump_rows_version()
        return len(in_pool)

    def move_back_to_pool(self, example_ids: Sequence[str]) -> list[str]:
        """Undo `move_to_dev` for these rows: back to the unlabeled pool, their label and record gone. Only rows the
        expert labeled into dev from the pool move (imported dev rows stay). Returns the ids that moved."""
        ids = [str(i) for i in example_ids]
        moving = [r[0] for r in self._q(
            "SELECT e.example_id FROM expert_labels e JOIN examples x ON x.id = e.example_id "
            "WHERE e.from_split = 'pool' AND x.split = 'dev' AND e.example_id IN (SELECT unnest(?)) "
            "ORDER BY x.ord", [ids])]
        if moving:
            with self.transaction():
                self._q("UPDATE examples SET split = 'pool', audit = FALSE, label = NULL, label_set = NULL "
                        "WHERE id IN (SELECT unnest(?))", [moving])
                self._q("DELETE FROM expert_labels WHERE example_id IN (SELECT unnest(?))", [moving])
                self._bump_rows_version()
        return moving

    # ---- which rows a split holds, cached until rows move ----------------------------------------
    def _bump_rows_version(self) -> None:
        self._q("INSERT OR REPLACE INTO meta VALUES (?, ?)", [ROWS_VERSION, json.dumps(uuid.uuid4().hex)])

    def rows_version(self) -> str | None:
        """The token of the workspace's current rows and splits (None before the first import)."""
        rows = self._q("SELECT value FROM meta WHERE key = ?", [ROWS_VERSION])
        return json.loads(rows[0][0]) if rows else None

    def _rows_cache(self) -> dict:
        """This workspace's cache for its current rows_version (a fresh one when the token changed)."""
        version, key = self.rows_version(), str(self.path)
        cached = self._split_rows_cache.get(key)
        if cached is None or cached[0] != version:
            cached = (version, {})
            self._split_rows_cache[key] = cached
        return cached[1]

    def split_rows(self, split: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, ords) of a split's rows (None: every row) in import order: ids as an object array, ords as int64
        (a row's permanent place, which votes are stored by). Cached until rows are added or change split."""
        cache = self._rows_cache()
        found = cache.get(("split", split))
        if found is None:
            where, params = split_filter(split) if split is not None else ("TRUE", [])
            frame = self._df(f"SELECT id, ord FROM examples WHERE {where} ORDER BY ord", params)
            found = (frame["id"].to_numpy(dtype=object), frame["ord"].to_numpy(dtype=np.int64))
            cache[("split", split)] = found
        return found

    def row_places(self, example_ids: Sequence[str]) -> np.ndarray:
        """Each id's place (`ord`), -1 for an id that is no row of the workspace."""
        cache = self._rows_cache()
        index = cache.get("index")
        if index is None:
            ids, ords = self.split_rows(None)
            index = cache["index"] = (pd.Index(ids, dtype=object), ords)
        found = index[0].get_indexer(pd.Index([str(i) for i in example_ids], dtype=object))
        return np.where(found >= 0, index[1][found], -1).astype(np.int64)

    @classmethod
    def forget_split_rows(cls, path: str | None = None) -> None:
        """Drop the cached split rows of one workspace file (None: all), e.g. when its connection closes."""
        if path is None:
            cls._split_rows_cache.clear()
        else:
            cls._split_rows_cache.pop(str(path), None)

    def expert_labels(self) -> pd.DataFrame:
        """Every row the expert labeled into dev: example_id, label, label_set, labeled_by, labeled_at, from_split,
        note, and the row's text; oldest first."""
        return self._df("SELECT e.*, x.text FROM expert_labels e JOIN examples x ON x.id = e.example_id "
                        "ORDER BY e.labeled_at, e.example_id")

    def expert_label_pairs(self) -> list[list]:
        """[id, label, label set] of each row the expert labeled into dev, by id: what saved soft labels depend on
        (a row returned and labeled again with another label is another dev row)."""
        return [[r[0], r[1], None if r[2] is None else [int(c) for c in r[2]]] for r in self._q(
            "SELECT example_id, label, label_set FROM expert_labels ORDER BY example_id")]

    def count_examples(self, split: str | None = None) -> int:
        if split is None:
            return self._q("SELECT count(*) FROM examples")[0][0]
        where, params = split_filter(split)
        return self._q(f"SELECT count(*) FROM examples WHERE {where}", params)[0][0]

    def split_counts(self) -> dict[str, int]:
        return dict(self._q("SELECT split, count(*) FROM examples GROUP BY split ORDER BY split"))

    def examples_frame(self, split: str | None = None, ids: Sequence[str] | None = None,
                       limit: int | None = None, offset: int = 0) -> pd.DataFrame:
        """Rows as a frame (id, text, fields as dict, split, label, audit, label_set), in import order.

        label_set is a tuple of class ids on multi-label rows, None elsewhere."""
        where, params = [], []
        if split is not None:
            clause, values = split_filter(split)
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

    # ---- gold labels -------------------------------------------------------------------------
    def example_ids(self, split: str | None = None) -> list[str]:
        if split is None:
            return [r[0] for r in self._q("SELECT id FROM examples ORDER BY ord")]
        where, params = split_filter(split)
        return [r[0] for r in self._q(f"SELECT id FROM examples WHERE {where} ORDER BY ord", params)]

    def label_indices(self, split: str) -> np.ndarray:
        """Gold class indices (into `Task.labels`, which holds the names) of a split, import order; -1 where
        unknown. On a multi-label task: each row's first label (`label_matrix` holds the sets)."""
        where, params = split_filter(split)
        rows = self._q(f"SELECT coalesce(label, -1) FROM examples WHERE {where} ORDER BY ord", params)
        return np.array([r[0] for r in rows], dtype=np.int64)

    def label_matrix(self, split: str) -> np.ndarray:
        """Gold label sets of a split as (n, k) 0/1, import order; all-zero rows where unknown.

        Single-label rows (no label_set) give a one-hot row of their label.
        """
        k = len(self.load_task().labels)
        where, params = split_filter(split)
        rows = self._q(f"SELECT label, label_set FROM examples WHERE {where} ORDER BY ord", params)
        out = np.zeros((len(rows), k), dtype=np.int64)
        for i, (label, label_set) in enumerate(rows):
            members = label_set if label_set is not None else ([] if label is None else [label])
            out[i, members] = 1
        return out

    def gold(self, split: str) -> np.ndarray:
        """What scoring compares votes with: (n,) class ids, or (n, k) 0/1 label sets on a multi-label task."""
        task = self.find_task()
        return self.label_matrix(split) if task is not None and task.multi_label else self.label_indices(split)

