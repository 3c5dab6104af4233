"""The workspace's logs and caches: progress events, the LLM call log and reply cache, embeddings, jobs.

`LogsMixin` is one part of `engine.store.workspace.Store`, kept apart so the store module itself stays about opening and
migrating the DuckDB file. None of these tables shapes the pool: they record what happened (events, LLM calls,
background jobs) or save recomputation (cached replies and embedding vectors). It runs SQL only through the
host's `_q`, `_df`, `_cur` and `transaction` (and stamps rows with its `_now`), so it never imports duckdb.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pandas as pd

from engine.store.base import StoreBase
from engine.store.sql import utc_now


class LogsMixin(StoreBase):
    """Events, LLM calls, embeddings and jobs of a workspace (mixed into `engine.store.workspace.Store`)."""

    # ---- events (live progress) --------------------------------------------------------------
    def add_event(self, run_id: str, kind: str, payload: dict) -> None:
        self._q("INSERT INTO events (run_id, recorded_at, kind, payload) VALUES (?, ?, ?, ?)",
                [run_id, utc_now(), kind, json.dumps(payload, default=str)])

    def events(self, run_id: str | None = None, after_seq: int = 0, limit: int = 500) -> list[dict]:
        sql, params = "SELECT seq, run_id, recorded_at, kind, payload FROM events WHERE seq > ?", list[Any]([after_seq])
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._q(sql + f" ORDER BY seq LIMIT {int(limit)}", params)
        return [{"seq": r[0], "run_id": r[1], "at": r[2], "kind": r[3], **json.loads(r[4])} for r in rows]

    # ---- LLM call log and cache --------------------------------------------------------------
    def record_llm_call(self, *, request_hash: str, role: str, model: str, prompt_hash: str, request: str,
                        reply: str | None, tokens_in: int, tokens_out: int, latency_s: float,
                        cost_usd: float, error: str | None = None, finish_reason: str | None = None) -> None:
        self._q("INSERT INTO llm_calls (request_hash, role, model, prompt_hash, request, reply, tokens_in, "
                "tokens_out, latency_s, cost_usd, error, recorded_at, finish_reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [request_hash, role, model, prompt_hash, request, reply, tokens_in, tokens_out, latency_s,
                 cost_usd, error, utc_now(), finish_reason])

    def cached_llm_answer(self, request_hash: str) -> tuple[str, str | None] | None:
        """(reply, finish_reason) of the first good reply to this request; an empty one (a 200 with no choices, an
        error body) is none: it would be served for free from then on instead of asking again. The finish reason
        is None on rows logged before it was kept (migration 009)."""
        rows = self._q("SELECT reply, finish_reason FROM llm_calls WHERE request_hash = ? AND error IS NULL "
                       "AND reply IS NOT NULL AND trim(reply) <> '' ORDER BY recorded_at LIMIT 1", [request_hash])
        return (rows[0][0], rows[0][1]) if rows else None

    def llm_spent(self) -> dict[str, float]:
        """What the workspace's LLM calls spent so far: HTTP attempts (one log row each), tokens, dollars."""
        row = self._q("SELECT count(*), coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_usd), 0) "
                      "FROM llm_calls")[0]
        return {"calls": int(row[0]), "tokens": int(row[1]), "usd": float(row[2])}

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
            self._q("INSERT INTO jobs (id, started_at) VALUES (?, ?)", [job_id, utc_now()])
        for key, value in values.items():
            if key not in {"kind", "status", "params", "progress", "message", "finished_at", "error"}:
                raise KeyError(key)
            if key == "params":
                value = json.dumps(value)
            self._q(f"UPDATE jobs SET {key} = ? WHERE id = ?", [value, job_id])

    def jobs(self) -> pd.DataFrame:
        return self._df("SELECT * FROM jobs ORDER BY started_at DESC")
