"""The pool's history: annotators, their scores and votes, generations, verdicts and pool membership.

`PoolMixin` is one part of `engine.store.workspace.Store`, kept apart so the store module itself stays about opening and
migrating the DuckDB file. It runs SQL only through the host's `_q`, `_df`, `_cur` and `transaction` (with
`store_sql`'s split filter and clock), and reads example ids through `ExamplesMixin.example_ids`, so it never imports
duckdb. Votes are stored sparse (abstains are not rows); the pool is every annotator whose latest verdict is
`accept` or `approve`, and a generation's verdicts and its `complete` status are written in one transaction.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pandas as pd

from engine.domain import ABSTAIN, SPLITS, Annotator, AnnotatorScore, GateDecision, VoteMatrix
from engine.store.sql import split_filter, utc_now


class PoolMixin:
    """Annotators, scores, votes, generations and verdicts of a workspace (mixed into `Store`)."""

    # ---- annotators, scores ------------------------------------------------------------------
    def save_annotator(self, a: Annotator) -> None:
        """Idempotent: the id is the code hash, so re-saving the same code is a no-op."""
        if self._q("SELECT 1 FROM annotators WHERE id = ?", [a.id]):
            return
        self._q(
            "INSERT INTO annotators (id, name, source, agent, generation, parent_ids, author, rationale, "
            "created_at, written_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [a.id, a.name, a.source, a.agent, a.generation, json.dumps(list(a.parent_ids)), a.author,
             a.rationale, utc_now(), a.written_by or None],
        )

    @staticmethod
    def _annotator(row: tuple) -> Annotator:
        id_, name, source, agent, generation, parents, author, rationale, written_by = row[:9]
        return Annotator(id_, name, source, agent, int(generation), tuple(json.loads(parents)), author,
                         rationale or "", written_by or "")

    _ANN_COLS = "id, name, source, agent, generation, parent_ids, author, rationale, written_by"

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

    def add_votes(self, annotator_id: str, example_ids: Sequence[str], votes: np.ndarray) -> None:
        """Set one annotator's votes on these rows only (rows that moved split: the rest of its run stands)."""
        votes = np.asarray(votes)
        fired = votes != ABSTAIN
        rows = pd.DataFrame({"annotator_id": annotator_id,
                             "example_id": np.asarray(example_ids, dtype=object)[fired],
                             "vote": votes[fired].astype(np.int32)})
        with self.transaction():
            self._q("DELETE FROM votes WHERE annotator_id = ? AND example_id IN (SELECT unnest(?))",
                    [annotator_id, [str(i) for i in example_ids]])
            self._cur.register("incoming_votes", rows)
            self._q("INSERT INTO votes SELECT annotator_id, example_id, vote FROM incoming_votes")
            self._cur.unregister("incoming_votes")

    def annotators_with_votes(self, split: str) -> list[str]:
        """Ids of the annotators that have a stored run on `split`."""
        return [r[0] for r in self._q("SELECT annotator_id FROM vote_runs WHERE split = ? ORDER BY annotator_id",
                                      [split])]

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
            clause, values = split_filter(split) if split else ("", [])
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

    # ---- generations and verdicts ------------------------------------------------------------
    def last_complete_generation(self) -> int:
        rows = self._q("SELECT max(number) FROM generations WHERE status = 'complete'")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def start_generation(self, number: int) -> None:
        self._q("DELETE FROM generations WHERE number = ? AND status <> 'complete'", [number])
        self._q("INSERT INTO generations (number, status, started_at) VALUES (?, 'running', ?)", [number, utc_now()])

    def stop_generation(self, number: int, status: str, note: str) -> None:
        """Record why a started generation did not complete (e.g. `starved`: the LLM budget ran out before
        any proposal); it is not complete, so the next run redoes it."""
        self._q("UPDATE generations SET status = ?, finished_at = ?, note = ? WHERE number = ?",
                [status, utc_now(), note, number])

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
                [utc_now(), f1_before, f1_after, n_candidates, n_accepted, pool_size, reverted, seconds, number],
            )

    def _insert_verdict(self, d: GateDecision, generation: int) -> None:
        self._q(
            "INSERT INTO verdicts (annotator_id, generation, verdict, reasons, decided_by, note, recorded_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [d.annotator_id, generation, d.verdict, json.dumps(list(d.reasons)), d.decided_by, d.note, utc_now()],
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

    def pool_ids(self, generation: int | None = None) -> list[str]:
        """The pool (now, or as it stood after `generation`): annotators whose latest verdict up to then puts
        them in it, oldest first. A human verdict counts from the generation that was last complete when given."""
        upto, params = ("WHERE generation <= ? ", [generation]) if generation is not None else ("", [])
        rows = self._q(
            "SELECT v.annotator_id FROM (SELECT annotator_id, arg_max(verdict, seq) AS verdict, min(seq) AS first "
            f"FROM verdicts {upto}GROUP BY annotator_id) v WHERE v.verdict IN ('accept', 'approve') ORDER BY v.first",
            params,
        )
        return [r[0] for r in rows]

