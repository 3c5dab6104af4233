"""Named, append-only schema migrations for the DuckDB workspace.

Never edit or reorder an applied migration: add a new one at the end. A migration is SQL, or a function of the
cursor for what SQL says badly (re-packing votes); either runs in the transaction that records it.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import numpy as np

from engine.store import vote_codes


def _pack_votes(cur: Any) -> None:
    """007: one row per vote (`votes`) -> one BLOB of int8 codes per (annotator, chunk of rows) (`vote_chunks`),
    by each row's import place. A vote whose example id is no row of the workspace could never be read and is
    dropped; a doubled vote (a killed write) keeps one of its values."""
    cur.execute("CREATE TABLE vote_chunks (annotator_id VARCHAR, chunk INTEGER, width TINYINT, codes BLOB, "
                "PRIMARY KEY (annotator_id, chunk))")
    frame = cur.execute(
        "SELECT v.annotator_id, e.ord, max(v.vote) AS vote FROM votes v JOIN examples e ON e.id = v.example_id "
        "GROUP BY v.annotator_id, e.ord ORDER BY v.annotator_id").df()
    for annotator_id, group in frame.groupby("annotator_id", sort=False):
        places, votes = group["ord"].to_numpy(dtype=np.int64), group["vote"].to_numpy(dtype=np.int64)
        empty = np.zeros(0, dtype=np.int64)
        rows = []
        for chunk, (positions, offsets) in vote_codes.split_by_chunk(places).items():
            codes, width = vote_codes.patch(None, 1, empty, offsets, votes[positions])
            if len(codes):
                rows.append((annotator_id, chunk, width, vote_codes.encode(codes, width)))
        if rows:  # one statement per annotator (executemany prepares one per row)
            cur.execute("INSERT INTO vote_chunks VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(rows)),
                        [value for row in rows for value in row])
    cur.execute("DROP TABLE votes")
    # the split-rows cache's token (engine.store.examples.ROWS_VERSION): a workspace from before it gets one
    cur.execute("INSERT OR REPLACE INTO meta VALUES ('rows_version', ?)", [json.dumps(uuid.uuid4().hex)])


MIGRATIONS: list[tuple[str, str | Callable[[Any], None]]] = [
    (
        "001_core",
        """
        CREATE SEQUENCE IF NOT EXISTS seq_verdicts;
        CREATE SEQUENCE IF NOT EXISTS seq_events;
        CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR);
        CREATE TABLE datasets (
            name VARCHAR PRIMARY KEY, source VARCHAR, imported_at TIMESTAMP, n_rows INTEGER);
        CREATE TABLE task (
            name VARCHAR, labels VARCHAR, label_descriptions VARCHAR, instructions VARCHAR,
            fields VARCHAR, multi_label BOOLEAN);
        CREATE TABLE examples (
            id VARCHAR PRIMARY KEY, ord INTEGER, text VARCHAR, fields VARCHAR,
            split VARCHAR, label INTEGER, dataset VARCHAR);
        CREATE TABLE annotators (
            id VARCHAR PRIMARY KEY, name VARCHAR, source VARCHAR, agent VARCHAR, generation INTEGER,
            parent_ids VARCHAR, author VARCHAR, rationale VARCHAR, created_at TIMESTAMP);
        CREATE TABLE scores (
            annotator_id VARCHAR PRIMARY KEY, fires INTEGER, coverage DOUBLE, precision DOUBLE,
            label INTEGER, correct INTEGER, faults INTEGER);
        CREATE TABLE votes (annotator_id VARCHAR, example_id VARCHAR, vote INTEGER);
        CREATE TABLE vote_runs (
            annotator_id VARCHAR, split VARCHAR, n INTEGER, faults INTEGER, first_error VARCHAR,
            seconds DOUBLE, PRIMARY KEY (annotator_id, split));
        CREATE TABLE generations (
            number INTEGER PRIMARY KEY, status VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP,
            dev_macro_f1_before DOUBLE, dev_macro_f1_after DOUBLE, n_candidates INTEGER,
            n_accepted INTEGER, pool_size INTEGER, reverted BOOLEAN, seconds DOUBLE);
        CREATE TABLE verdicts (
            seq BIGINT DEFAULT nextval('seq_verdicts'), annotator_id VARCHAR, generation INTEGER,
            verdict VARCHAR, reasons VARCHAR, decided_by VARCHAR, note VARCHAR, recorded_at TIMESTAMP);
        CREATE TABLE events (
            seq BIGINT DEFAULT nextval('seq_events'), run_id VARCHAR, recorded_at TIMESTAMP, kind VARCHAR,
            payload VARCHAR);
        """,
    ),
    (
        "002_llm_embeddings_jobs",
        """
        CREATE TABLE llm_calls (
            request_hash VARCHAR, role VARCHAR, model VARCHAR, prompt_hash VARCHAR, request VARCHAR,
            reply VARCHAR, tokens_in INTEGER, tokens_out INTEGER, latency_s DOUBLE, cost_usd DOUBLE,
            error VARCHAR, recorded_at TIMESTAMP);
        CREATE TABLE embeddings (
            model VARCHAR, text_hash VARCHAR, vector FLOAT[], PRIMARY KEY (model, text_hash));
        CREATE TABLE jobs (
            id VARCHAR PRIMARY KEY, kind VARCHAR, status VARCHAR, params VARCHAR, progress DOUBLE,
            message VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP, error VARCHAR);
        """,
    ),
    (
        "003_audit_rows",
        # dev rows the agents and the gate never see: the auto aggregator chooses on them (see ingest)
        "ALTER TABLE examples ADD COLUMN audit BOOLEAN DEFAULT FALSE;",
    ),
    (
        "004_label_sets",
        # a multi-label row's gold classes; `label` keeps the first one. NULL on single-label rows
        "ALTER TABLE examples ADD COLUMN label_set INTEGER[];",
    ),
    (
        "005_provenance_and_stops",
        # who wrote an annotator ("llm:<model>", "offline", "person"); why a generation did not complete
        "ALTER TABLE annotators ADD COLUMN written_by VARCHAR; ALTER TABLE generations ADD COLUMN note VARCHAR;",
    ),
    (
        "006_expert_labels",
        # unlabeled (pool) rows the expert labeled in the studio, which then joined dev: who, when, from where
        """
        CREATE TABLE expert_labels (
            example_id VARCHAR PRIMARY KEY, label INTEGER, label_set INTEGER[], labeled_by VARCHAR,
            labeled_at TIMESTAMP, from_split VARCHAR, note VARCHAR);
        """,
    ),
    ("007_packed_votes", _pack_votes),
    (
        "008_mined_on_guesses",
        # a cue the offline improver mined on the pool sample's guessed labels (`Annotator.mined_on_guesses`); before
        # this column the improver said so in the rationale, which is read back once here
        "ALTER TABLE annotators ADD COLUMN mined_on_guesses BOOLEAN DEFAULT FALSE; "
        "UPDATE annotators SET mined_on_guesses = TRUE "
        "WHERE rationale LIKE '%mined on the unlabeled sample''s guessed labels%';",
    ),
    (
        "009_llm_finish_reason",
        # why a reply ended ("length": it hit max_tokens), so a cached reply is judged as the first one was (a repair
        # prompt blames the limit only then, and must match to be served from the cache). NULL on older rows
        "ALTER TABLE llm_calls ADD COLUMN finish_reason VARCHAR;",
    ),
    (
        "010_code_drafts",
        # an annotator's unsaved edit in the studio, kept in the workspace so a reload (a new browser session) does
        # not lose it; gone when saved as a version or discarded
        "CREATE TABLE code_drafts (annotator_id VARCHAR PRIMARY KEY, source VARCHAR, saved_at TIMESTAMP);",
    ),
    (
        "011_who",
        # several experts on one workspace: the person behind each expert verdict (NULL for the gate's and for
        # verdicts from before), and every description a person gave a label, with who and when
        "ALTER TABLE verdicts ADD COLUMN expert VARCHAR; "
        "CREATE TABLE label_descriptions_log (label VARCHAR, description VARCHAR, previous VARCHAR, expert VARCHAR, "
        "recorded_at TIMESTAMP);",
    ),
]
