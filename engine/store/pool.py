"""The pool's history: annotators, their scores and votes, generations, verdicts and pool membership.

`PoolMixin` is one part of `engine.store.workspace.Store`, kept apart so the store module itself stays about opening and
migrating the DuckDB file. It runs SQL only through the host's `_q`, `_df`, `_cur` and `transaction` (with
`store_sql`'s clock), and reads which rows a split holds through `ExamplesMixin.split_rows`, so it never imports
duckdb. Votes are packed (`vote_codes`: one BLOB of int8 codes per annotator and chunk of 65,536 rows, by each
row's permanent import place, so rows changing split never disturb them; `vote_runs` says which splits an
annotator was run on); the pool is every annotator whose latest verdict is `accept` or `approve`, and a
generation's verdicts and its `complete` status are written in one transaction.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from engine.domain import (
    ABSTAIN,
    LOCK_ECHOES,
    SPLITS,
    UNDID,
    UNDO,
    Annotator,
    AnnotatorScore,
    GateDecision,
    VoteMatrix,
    restored_by_undo,
)
from engine.store import vote_codes
from engine.store.actor import acting_expert
from engine.store.base import StoreBase
from engine.store.sql import utc_now


class PoolMixin(StoreBase):
    """Annotators, scores, votes, generations and verdicts of a workspace (mixed into `Store`)."""

    # ---- annotators, scores ------------------------------------------------------------------
    def save_annotator(self, a: Annotator) -> None:
        """Idempotent: the id is the code hash, so re-saving the same code is a no-op."""
        if self._q("SELECT 1 FROM annotators WHERE id = ?", [a.id]):
            return
        self._q(
            "INSERT INTO annotators (id, name, source, agent, generation, parent_ids, author, rationale, "
            "created_at, written_by, mined_on_guesses) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [a.id, a.name, a.source, a.agent, a.generation, json.dumps(list(a.parent_ids)), a.author,
             a.rationale, utc_now(), a.written_by or None, a.mined_on_guesses],
        )

    @staticmethod
    def _annotator(row: tuple) -> Annotator:
        id_, name, source, agent, generation, parents, author, rationale, written_by, mined_on_guesses = row[:10]
        return Annotator(id_, name, source, agent, int(generation), tuple(json.loads(parents)), author,
                         rationale or "", written_by or "", bool(mined_on_guesses))

    _ANN_COLS = "id, name, source, agent, generation, parent_ids, author, rationale, written_by, mined_on_guesses"

    def annotator(self, annotator_id: str) -> Annotator | None:
        rows = self._q(f"SELECT {self._ANN_COLS} FROM annotators WHERE id = ?", [annotator_id])
        return self._annotator(rows[0]) if rows else None

    def annotators(self, ids: Sequence[str] | None = None, generation: int | None = None) -> list[Annotator]:
        sql, params = f"SELECT {self._ANN_COLS} FROM annotators", list[Any]()
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
        """Store one annotator's votes on one split: its earlier votes on the split's rows are replaced."""
        if split not in SPLITS:
            raise ValueError(f"votes are stored per split ({', '.join(SPLITS)}), not per {split!r}")
        votes = np.asarray(votes)
        with self.transaction():
            split_ids, split_places = self.split_rows(split)
            # the usual call: the split's own rows in order (then no id lookup is needed)
            whole = len(split_ids) == len(example_ids) and bool(
                (split_ids == np.asarray(example_ids, dtype=object)).all())
            # writing every row of the split replaces each of them: nothing is left to clear first
            self._write_votes(annotator_id, np.zeros(0, dtype=np.int64) if whole else split_places, example_ids,
                              votes, split_places if whole else None)
            self._q("INSERT OR REPLACE INTO vote_runs VALUES (?, ?, ?, ?, ?, ?)",
                    [annotator_id, split, len(votes), faults, first_error, seconds])

    def add_votes(self, annotator_id: str, example_ids: Sequence[str], votes: np.ndarray) -> None:
        """Set one annotator's votes on these rows only (rows that moved split: the rest of its run stands)."""
        with self.transaction():
            self._write_votes(annotator_id, np.zeros(0, dtype=np.int64), example_ids, np.asarray(votes))

    def _write_votes(self, annotator_id: str, clear: np.ndarray, example_ids: Sequence[str],
                     votes: np.ndarray, places: np.ndarray | None = None) -> None:
        """Abstain on the rows at places `clear`, then vote `votes` on `example_ids` (at `places` when the
        caller knows them), chunk by chunk, in the caller's transaction. An id that is no row of the workspace
        is an error: its vote could never be read."""
        if len(votes) != len(example_ids):
            raise ValueError(f"{len(votes)} votes for {len(example_ids)} rows")
        if places is None:
            places = self.row_places(example_ids)
        if (places < 0).any():
            unknown = [str(example_ids[i]) for i in np.flatnonzero(places < 0)[:3]]
            raise KeyError(f"votes for rows the workspace does not hold: {unknown}")
        writes, clears = vote_codes.split_by_chunk(places), vote_codes.split_by_chunk(clear)
        chunks = sorted(set(writes) | set(clears))
        if not chunks:
            return
        stored = {c: (w, b) for c, w, b in self._q(
            "SELECT chunk, width, codes FROM vote_chunks WHERE annotator_id = ? AND chunk IN (SELECT unnest(?))",
            [annotator_id, chunks])}
        empty = np.zeros(0, dtype=np.int64)
        keep, drop = [], []
        for chunk in chunks:
            width, blob = stored.get(chunk, (1, None))
            positions, offsets = writes.get(chunk, (empty, empty))
            codes, width = vote_codes.patch(None if blob is None else vote_codes.decode(blob, width), width,
                                            clears.get(chunk, (empty, empty))[1], offsets, votes[positions])
            if len(codes):
                keep.append((annotator_id, chunk, width, vote_codes.encode(codes, width)))
            elif blob is not None:
                drop.append(chunk)  # every row abstains: no BLOB at all
        if drop:
            self._q("DELETE FROM vote_chunks WHERE annotator_id = ? AND chunk IN (SELECT unnest(?))",
                    [annotator_id, drop])
        if keep:  # one statement: a prepared insert per chunk cost twice as much
            self._q("INSERT OR REPLACE INTO vote_chunks VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(keep)),
                    [value for row in keep for value in row])

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
        """Dense (n_examples, n_annotators) int32 votes, rows in import order (or in `example_ids` order; with a
        split as well, rows outside the split abstain)."""
        if example_ids is None:
            ids, places = self.split_rows(split)
            example_ids = tuple(ids.tolist())
        else:
            example_ids = tuple(example_ids)
            places = self.row_places(example_ids)
            if split is not None:
                places = np.where(np.isin(places, self.split_rows(split)[1]), places, -1)
        annotator_ids = list(annotator_ids)
        dense = np.full((len(example_ids), len(annotator_ids)), ABSTAIN, dtype=np.int32)
        known = np.flatnonzero(places >= 0)
        by_chunk = {c: (known[pos], off) for c, (pos, off) in vote_codes.split_by_chunk(places[known]).items()}
        if annotator_ids and by_chunk:
            column = {a: j for j, a in enumerate(annotator_ids)}
            blobs = self._cur.execute(
                "SELECT annotator_id, chunk, width, codes FROM vote_chunks WHERE annotator_id IN (SELECT unnest(?)) "
                "AND chunk IN (SELECT unnest(?))", [annotator_ids, sorted(by_chunk)])
            while batch := blobs.fetchmany(256):
                for annotator_id, chunk, width, blob in batch:
                    rows, offsets = by_chunk[chunk]
                    codes = vote_codes.decode(blob, width)
                    inside = offsets < len(codes)  # past the BLOB's end: abstains
                    dense[rows[inside], column[annotator_id]] = codes[offsets[inside]]
        return VoteMatrix(dense, example_ids, tuple(annotator_ids))

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
        """Write a generation's verdicts and mark it complete, atomically. No verdict is written on an annotator whose
        latest verdict is the expert's (given before or while the generation ran): it stands as the expert gave it,
        reason included; a later row, the gate's or an echo of the lock without the reason, would outrank it. Nor
        is a prune written whose replacement the expert rejected meanwhile: the member stays. Nor the gate's echo of
        a lock (decided by "human"): it adds nothing while the lock stands, and one the expert undid meanwhile it
        would bring back."""
        with self.transaction():
            judged = self.human_locked()
            decisions = [d for d in decisions if d.annotator_id not in judged and d.decided_by != "human"
                         and not (d.verdict == "prune" and judged.get(d.pruned_by) == "reject")]
            n_accepted = sum(d.verdict == "accept" for d in decisions)
            for d in decisions:
                self._insert_verdict(d, number)
            self._q(
                "UPDATE generations SET status = 'complete', finished_at = ?, dev_macro_f1_before = ?, "
                "dev_macro_f1_after = ?, n_candidates = ?, n_accepted = ?, pool_size = ?, reverted = ?, "
                "seconds = ? WHERE number = ?",
                [utc_now(), f1_before, f1_after, n_candidates, n_accepted, pool_size, reverted, seconds, number],
            )

    def _insert_verdict(self, d: GateDecision, generation: int) -> None:
        """One verdict row; a person's (an expert's, or an undo of one) carries who gave it (`store.actor`)."""
        expert = acting_expert() if d.decided_by != "gate" else None
        self._q(
            "INSERT INTO verdicts (annotator_id, generation, verdict, reasons, decided_by, note, recorded_at, expert) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [d.annotator_id, generation, d.verdict, json.dumps(list(d.reasons)), d.decided_by, d.note, utc_now(),
             expert],
        )

    def record_gate_decisions(self, decisions: Sequence[GateDecision]) -> None:
        """The gate's accepts and prunes decided outside a generation (`evopool pool add`, the studio's new
        annotator: a newcomer and the members it replaces), recorded as of the last complete generation, as a human
        verdict then is. Call within `transaction()` with whatever else they come with (the newcomer's save)."""
        generation = self.last_complete_generation()
        for d in decisions:
            if d.verdict in ("accept", "prune") and d.decided_by == "gate":
                self._insert_verdict(d, generation)

    def record_human_verdict(self, annotator_id: str, verdict: str, note: str) -> None:
        """An expert's approve / reject: stored, and respected by every later generation."""
        if verdict not in ("approve", "reject"):
            raise ValueError(f"a human verdict is 'approve' or 'reject', not {verdict!r}")
        if not note.strip():
            raise ValueError("a human verdict needs a reason")
        self._insert_verdict(GateDecision(annotator_id, verdict, (), "human", note.strip()),
                             self.last_complete_generation())

    def verdicts_version(self) -> int:
        """The number of the last verdict recorded (0 before any): changes with every verdict."""
        return int(self._q("SELECT coalesce(max(seq), 0) FROM verdicts")[0][0])

    def save_draft(self, annotator_id: str, source: str) -> None:
        """Keep an unsaved edit of `annotator_id` in the workspace (one per annotator: the latest)."""
        self._q("INSERT OR REPLACE INTO code_drafts VALUES (?, ?, ?)", [annotator_id, source, utc_now()])

    def draft(self, annotator_id: str) -> tuple[str, datetime] | None:
        """(source, when kept) of the unsaved edit of `annotator_id`, or None."""
        rows = self._q("SELECT source, saved_at FROM code_drafts WHERE annotator_id = ?", [annotator_id])
        return (rows[0][0], rows[0][1]) if rows else None

    def drop_draft(self, annotator_id: str) -> None:
        self._q("DELETE FROM code_drafts WHERE annotator_id = ?", [annotator_id])

    def last_gate_verdict(self, generation: int) -> int:
        """The number (seq) of the last verdict the gate gave while `generation` ran (0 when it gave none): not one
        dated to it from outside a generation (`record_gate_decisions`: a pool add), which came later."""
        return int(self._q(
            "SELECT coalesce(max(v.seq), 0) FROM verdicts v JOIN generations g ON g.number = v.generation "
            "WHERE v.decided_by = 'gate' AND v.generation = ? AND v.recorded_at <= g.finished_at",
            [generation])[0][0])

    def gate_generations(self) -> set[int]:
        """The generations in which the gate gave at least one verdict."""
        return {int(r[0]) for r in self._q("SELECT DISTINCT generation FROM verdicts WHERE decided_by = 'gate'")}

    def verdict_states(self, annotator_id: str) -> list[dict]:
        """An annotator's verdicts as the states undo steps through, oldest first (`_verdict_states`): the last is the
        one in force, with the reasons, note and generation it was given with."""
        return _verdict_states(self.verdicts(annotator_id))

    def undoable(self, annotator_id: str) -> tuple[int, str] | None:
        """(number (seq), verdict) of the expert's verdict an undo would take back, or None when there is none to
        undo: the latest is not the expert's, or it is their only one (an annotator the expert wrote)."""
        states = self.verdict_states(annotator_id)
        if len(states) < 2 or states[-1]["decided_by"] != "human":
            return None
        return int(states[-1]["seq"]), str(states[-1]["verdict"])

    def withdraw_human_verdict(self, annotator_id: str, note: str = "", expected: int | None = None,
                               retire: Callable[[], tuple[str, str] | None] | None = None) -> str:
        """Undo an expert's verdict on an annotator: the verdict it overrode (the gate's, or the expert's before)
        stands again, as a new row (the log keeps both). A restored gate verdict is decided by "undo", so no human
        lock is left and the gate weighs the annotator again as before; a restored expert verdict is the expert's
        again. Undo again and the one before that returns. `expected`: the number of the verdict the caller means to
        undo (what it showed, `undoable`); refused if another has been given or undone since. `retire()`, asked
        before the undo is written: (another annotator, the expert's note) to reject in the same transaction when the
        restored verdict puts this one in the pool (an edit and its parent never vote side by side, not even between
        two writes a generation could read apart). Returns the verdict now in force."""
        with self.transaction():
            states = self.verdict_states(annotator_id)
            if expected is not None and (not states or int(states[-1]["seq"]) != expected):
                raise ValueError("its verdicts changed since this screen was drawn (another tab or a generation): "
                                 "look again before undoing")
            if not states or states[-1]["decided_by"] != "human":
                raise ValueError("its latest verdict is not an expert's: there is nothing to undo")
            if len(states) < 2:
                raise ValueError("the expert's verdict is its only one (an annotator the expert wrote): there is no "
                                 "earlier verdict to return to; give the opposite verdict instead")
            leaving = retire() if retire is not None else None
            undone, earlier = states[-1], states[-2]
            said = f"{UNDID} {undone['verdict']}" + (f": {note.strip()}" if note.strip() else "")
            by = "human" if earlier["decided_by"] == "human" else UNDO
            self._insert_verdict(GateDecision(annotator_id, earlier["verdict"], (*earlier["reasons"], said), by,
                                              earlier["note"] if by == "human" else said),
                                 self.last_complete_generation())
            if leaving is not None and earlier["verdict"] in ("accept", "approve"):
                self._insert_verdict(GateDecision(leaving[0], "reject", (), "human", leaving[1]),
                                     self.last_complete_generation())
            return str(earlier["verdict"])

    def generations(self) -> pd.DataFrame:
        return self._df("SELECT * FROM generations ORDER BY number")

    def verdicts(self, annotator_id: str | None = None, generation: int | None = None) -> pd.DataFrame:
        sql, params, where = "SELECT * FROM verdicts", list[Any](), list[str]()
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




def _verdict_states(rows: pd.DataFrame) -> list[dict]:
    """An annotator's verdict log (oldest first) as the states undo steps back through: a verdict repeating the one
    in force (the gate's own, or an echo of an expert's lock that workspaces written before complete_generation
    dropped them hold) is no new state, and a verdict an undo restored takes the undone one off."""
    states: list[dict] = []
    for row in rows.to_dict("records"):
        reasons = list(row["reasons"])
        if restored_by_undo(reasons):
            if states:
                states.pop()
            continue
        if states and (states[-1]["verdict"], states[-1]["decided_by"]) == (row["verdict"], row["decided_by"]) \
                and (row["decided_by"] != "human" or any(r in LOCK_ECHOES for r in reasons)):
            continue  # the gate repeating what stands; an expert's second reject with a new reason is a step
        states.append(row)
    return states
