"""The DuckDB workspace on a real file: migrations, votes, verdict history, locking."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest

from engine.domain import ABSTAIN, Annotator, AnnotatorScore, GateDecision
from engine.store import vote_codes
from engine.store.migrations import MIGRATIONS
from engine.store.workspace import Store


def seeded(tmp_path) -> Store:
    store = Store.open(tmp_path / "ws")
    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": ["w", "x", "y", "z"],
                          "fields": [{}, {"k": 1}, {}, {}], "split": ["dev", "dev", "pool", "test"],
                          "label": [0, 1, None, 1]})
    store.add_examples("toy", "memory", frame)
    return store


def ann(i: int, generation: int = 1) -> Annotator:
    return Annotator(id=f"id{i}", name=f"a{i}", source=f"def annotate(example):\n    return {i}",
                     agent="generator", generation=generation)


def test_migrations_apply_once_and_reopen_keeps_data(tmp_path):
    seeded(tmp_path)
    Store.close_all()
    again = Store.open(tmp_path / "ws")
    assert again.count_examples() == 4
    assert again._q("SELECT count(*) FROM _migrations")[0][0] == len(MIGRATIONS)


def test_votes_are_sparse_and_dense_matrix_is_ordered(tmp_path):
    store = seeded(tmp_path)
    store.save_annotator(ann(1))
    store.save_annotator(ann(1))  # idempotent: same id
    store.save_annotator(ann(2))
    store.save_votes("id1", "dev", ["a", "b"], np.array([1, ABSTAIN]))
    store.save_votes("id2", "dev", ["a", "b"], np.array([0, 0]), faults=1, first_error="boom")
    # packed: one BLOB per annotator and chunk, int8 codes up to the last row that gets a vote
    chunks = store._q("SELECT annotator_id, chunk, width, codes FROM vote_chunks ORDER BY 1")
    assert [(a, c, w, vote_codes.decode(b, w).tolist()) for a, c, w, b in chunks] == [
        ("id1", 0, 1, [1]), ("id2", 0, 1, [0, 0])]
    vm = store.vote_matrix(["id2", "id1"], "dev")
    assert vm.example_ids == ("a", "b")
    np.testing.assert_array_equal(vm.votes, [[0, 1], [0, ABSTAIN]])
    assert store.voted_splits("id2")["dev"]["first_error"] == "boom"
    # re-running an annotator on a split replaces its votes there
    store.save_votes("id1", "dev", ["a", "b"], np.array([ABSTAIN, 0]))
    np.testing.assert_array_equal(store.vote_matrix(["id1"], "dev").votes[:, 0], [ABSTAIN, 0])
    assert len(store.annotators()) == 2


def test_pool_follows_latest_verdict_and_humans_lock(tmp_path):
    store = seeded(tmp_path)
    for i in (1, 2, 3):
        store.save_annotator(ann(i))
    store.start_generation(1)
    store.complete_generation(1, [GateDecision("id1", "accept", ("ok",)), GateDecision("id2", "accept", ("ok",)),
                                  GateDecision("id3", "reject", ("precision 0.1 < 0.3",))],
                              f1_before=0.0, f1_after=0.5, n_candidates=3, pool_size=2, reverted=False,
                              seconds=0.1)
    assert store.pool_ids() == ["id1", "id2"]
    store.record_human_verdict("id3", "approve", "I checked these fires by hand")
    store.record_human_verdict("id1", "reject", "fires on sarcasm")
    assert store.pool_ids() == ["id2", "id3"]
    assert store.human_locked() == {"id3": "approve", "id1": "reject"}
    with pytest.raises(ValueError, match="needs a reason"):
        store.record_human_verdict("id2", "reject", "  ")
    history = store.verdicts("id3")
    assert list(history["verdict"]) == ["reject", "approve"]
    assert history["reasons"].iloc[0] == ["precision 0.1 < 0.3"]


def test_an_undo_given_while_a_generation_ran_is_not_undone_by_the_gates_echo_of_the_lock(tmp_path):
    """The gate, having read the expert's reject before the undo, echoes the lock on the candidate it weighs again
    ("rejected by a human earlier", decided by "human"); written, it locked the annotator out once more. The echo
    adds nothing while a lock stands, so it is never written."""
    store = seeded(tmp_path)
    store.save_annotator(ann(1))
    store.start_generation(1)
    store.complete_generation(1, [GateDecision("id1", "accept", ("ok",))], f1_before=0.0, f1_after=0.5,
                              n_candidates=1, pool_size=1, reverted=False, seconds=0.1)
    store.record_human_verdict("id1", "reject", "too broad")
    store.start_generation(2)  # the gate reads the lock here
    assert store.withdraw_human_verdict("id1", "clicked the wrong one") == "accept"  # meanwhile, the expert's undo
    store.complete_generation(2, [GateDecision("id1", "reject", ("rejected by a human earlier",), "human")],
                              f1_before=0.5, f1_after=0.5, n_candidates=1, pool_size=1, reverted=False, seconds=0.1)
    assert store.pool_ids() == ["id1"] and store.human_locked() == {}


def test_incomplete_generation_is_not_counted(tmp_path):
    store = seeded(tmp_path)
    store.start_generation(1)
    store.complete_generation(1, [], f1_before=0, f1_after=0, n_candidates=0, pool_size=0, reverted=False,
                              seconds=0)
    store.start_generation(2)  # a run killed here leaves generation 2 'running'
    assert store.last_complete_generation() == 1
    store.start_generation(2)  # a resumed run restarts it cleanly
    assert list(store.generations()["status"]) == ["complete", "running"]


def test_failed_transaction_leaves_nothing(tmp_path):
    store = seeded(tmp_path)
    store.save_annotator(ann(1))
    store.start_generation(1)
    bad = GateDecision("id1", "accept", (object(),))  # reasons that cannot be serialised
    with pytest.raises(TypeError):
        store.complete_generation(1, [GateDecision("id1", "accept", ("ok",)), bad], f1_before=0, f1_after=0,
                                  n_candidates=1, pool_size=1, reverted=False, seconds=0)
    assert store.pool_ids() == [] and store.last_complete_generation() == 0


def test_threads_share_a_workspace(tmp_path):
    store = seeded(tmp_path)
    errors = []

    def writer(i: int) -> None:
        try:
            for j in range(20):
                store.add_event(f"run{i}", "tick", {"j": j})
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert len(store.events(limit=1000)) == 80
    assert [e["j"] for e in store.events("run2")] == list(range(20))


def test_two_threads_writing_the_same_annotators_votes_and_score_do_not_conflict(tmp_path):
    """A generation's catch-up and the studio's label save write one candidate's votes and score at once: DuckDB
    refused the second overlapping write ("Conflict on update"), failing the run or the expert's save."""
    store = seeded(tmp_path)
    store.save_annotator(ann(1))
    errors: list[Exception] = []

    def writer(vote: int) -> None:
        mine = Store.open(tmp_path / "ws")  # as each thread opens it: the job's store, the page's store
        try:
            for _ in range(60):
                mine.add_votes("id1", ["a", "b"], np.array([vote, vote]))
                mine.save_score(AnnotatorScore("id1", 2, 1.0, 0.5, vote, 1, 0))
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1, 0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors[:1]
    assert store.vote_matrix(["id1"], "dev").votes[:, 0].tolist() in ([0, 0], [1, 1])


def test_second_process_gets_a_clear_lock_error(tmp_path):
    seeded(tmp_path)
    code = ("import sys; from engine.store.workspace import Store, WorkspaceLocked\n"
            "try:\n    Store.open(sys.argv[1])\nexcept WorkspaceLocked as e:\n    print('LOCKED', e); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ws")], capture_output=True, text=True)
    assert out.returncode == 3 and "in use by another process" in out.stdout


def test_embedding_and_llm_caches(tmp_path):
    store = seeded(tmp_path)
    store.save_embeddings("m", ["h1", "h2"], np.array([[1, 0], [0, 1]], dtype=np.float32))
    got = store.cached_embeddings("m", ["h2", "h3"])
    assert set(got) == {"h2"} and got["h2"].tolist() == [0.0, 1.0]
    store.record_llm_call(request_hash="r", role="generator", model="m", prompt_hash="p", request="{}",
                          reply="```python\n```", tokens_in=3, tokens_out=4, latency_s=0.1, cost_usd=0.0)
    assert store.cached_llm_answer("other") is None
    # a row without a finish reason (as logged before migration 009) reads as unknown, not as cut off
    assert store.cached_llm_answer("r") == ("```python\n```", None)
    store.record_llm_call(request_hash="cut", role="generator", model="m", prompt_hash="p", request="{}",
                          reply="```python\ndef", tokens_in=3, tokens_out=4, latency_s=0.1, cost_usd=0.0,
                          finish_reason="length")
    assert store.cached_llm_answer("cut") == ("```python\ndef", "length")


def test_the_mined_on_guesses_flag_round_trips_and_an_older_workspace_reads_it_off_the_rationale(tmp_path):
    """Since migration 008 the flag is a column; a workspace from before it (the improver said so in the rationale)
    gets it back-filled from those words once."""
    import dataclasses

    import duckdb

    from engine.pseudo_labels import MINED_ON_GUESSES
    from engine.store.workspace import DB_NAME

    store = seeded(tmp_path)
    store.save_annotator(dataclasses.replace(ann(1), mined_on_guesses=True))
    store.save_annotator(ann(2))
    assert store.annotator("id1").mined_on_guesses and not store.annotator("id2").mined_on_guesses
    Store.close_all()
    (tmp_path / "old").mkdir()
    con = duckdb.connect(str(tmp_path / "old" / DB_NAME))
    con.execute("CREATE TABLE _migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
    for name, sql in MIGRATIONS[:7]:
        sql(con) if callable(sql) else con.execute(sql)
        con.execute("INSERT INTO _migrations VALUES (?, now())", [name])
    for i, rationale in ((1, f"improver: a cue ({MINED_ON_GUESSES})"), (2, "generator: a cue")):
        con.execute("INSERT INTO annotators (id, name, source, agent, generation, parent_ids, author, rationale) "
                    "VALUES (?, ?, 'def annotate(example):\n    return None', 'improver', 1, '[]', 'agent', ?)",
                    [f"old{i}", f"old{i}", rationale])
    con.close()
    old = Store.open(tmp_path / "old")
    assert old.annotator("old1").mined_on_guesses and not old.annotator("old2").mined_on_guesses


def test_a_label_described_after_import_is_saved_replaced_and_removed_and_the_task_reopens_with_it(tmp_path):
    from engine.domain import Task

    store = Store.open(tmp_path / "ws")
    with pytest.raises(ValueError, match="import data first"):
        store.describe_label("HAM", "x")
    store.save_task(Task("spam", ("HAM", "SPAM"), {"SPAM": "ads"}))
    assert store.describe_label("HAM", "  a genuine comment  ") == ""
    assert store.describe_label("SPAM", "links, self-promotion") == "ads"  # the one it replaced, for undo
    assert dict(store.load_task().label_descriptions) == {"HAM": "a genuine comment",
                                                         "SPAM": "links, self-promotion"}
    assert store.describe_label("HAM", "   ") == "a genuine comment"  # blank removes it
    with pytest.raises(ValueError, match="unknown label 'EGGS'; the labels are HAM, SPAM"):
        store.describe_label("EGGS", "x")
    Store.close_all()
    task = Store.open(tmp_path / "ws").load_task()
    assert dict(task.label_descriptions) == {"SPAM": "links, self-promotion"} and task.labels == ("HAM", "SPAM")


def test_a_truncated_workspace_is_damaged_and_is_not_kept_open(tmp_path, demo_csv):
    """A cut-off file may connect and fail on its first read (the migrations'): that had escaped as DuckDB's
    IOException, a traceback in the CLI, and left the broken connection cached for the next open."""
    from engine.ingest.importer import import_path
    from engine.store.workspace import WorkspaceDamaged

    import_path(Store.open(tmp_path / "ws"), demo_csv)
    Store.close_all()
    file = tmp_path / "ws" / "workspace.duckdb"
    file.write_bytes(file.read_bytes()[:300_000])
    for _ in range(2):  # the second open fails the same way: nothing broken was cached
        with pytest.raises(WorkspaceDamaged, match="damaged or not a workspace"):
            Store.open(tmp_path / "ws")


def test_every_kind_of_write_takes_the_workspaces_write_lock_and_a_read_does_not(tmp_path):
    """Writes are told by the statement's first word: a 6-character prefix never matched ALTER or DROP (no call
    of `_q` issues them today; the guard is for the first that does)."""
    store = seeded(tmp_path)

    class Counting:
        def __init__(self, lock):
            self.lock, self.entered = lock, 0

        def __enter__(self):
            self.entered += 1
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    store._writing = spy = Counting(store._writing)
    store._q("CREATE TABLE scratch (x INTEGER)")
    store._q("insert into scratch VALUES (1)")
    store._q("  ALTER TABLE scratch ADD COLUMN y INTEGER")
    store._q("update scratch SET y = 2")
    store._q("DELETE FROM scratch WHERE x = 0")
    assert spy.entered == 5
    assert store._q("SELECT x, y FROM scratch") == [(1, 2)] and spy.entered == 5  # a read takes no lock
    store._q("\n drop TABLE scratch")
    assert spy.entered == 6


def test_stale_labels_say_whether_the_pool_or_the_rows_changed(tmp_path):
    """The labels screen said "the dev rows changed" when rows were imported under an unchanged pool: the reason
    reads the same parts the labels' key hashes."""
    from engine.store.saved_labels import pool_key, stale_reason

    store = seeded(tmp_path)
    store.save_annotator(ann(1))
    store.record_human_verdict("id1", "approve", "keep")
    key, pool = pool_key(store), store.pool_ids()
    assert stale_reason(store, pool, key) is None
    store.add_examples("more", "memory", pd.DataFrame({"id": ["e"], "text": ["v"], "fields": [{}], "split": ["pool"],
                                                       "label": [None]}))
    assert stale_reason(store, pool, key).startswith("The rows changed")
    since_rows = pool_key(store)
    store.record_human_verdict("id1", "reject", "drop")
    assert stale_reason(store, pool, since_rows) == "The pool changed"
    # both changed since `key`: both are named (the pool alone was, a browser walk)
    assert stale_reason(store, pool, key).startswith("The pool changed, and the rows changed")
    assert stale_reason(store, (), key) == "The pool or the rows changed"  # saved before the pool was recorded
