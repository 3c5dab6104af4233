"""Packed votes on a real DuckDB file: round trip against a plain model, the upgrade from one-row-per-vote
workspaces, rows moving split (the cached split rows must follow), and 0- and 1-row workspaces."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from engine.domain import ABSTAIN
from engine.store import vote_codes
from engine.store.migrations import MIGRATIONS
from engine.store.workspace import DB_NAME, Store


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 4 rows, so a handful of rows spans several BLOBs and their edges."""
    monkeypatch.setattr(vote_codes, "CHUNK_ROWS", 4)


@pytest.fixture(autouse=True)
def closed():
    yield
    Store.close_all()


def workspace(tmp_path, splits: list[str]) -> Store:
    store = Store.open(tmp_path / "ws")
    n = len(splits)
    if n:
        store.add_examples("toy", "memory", pd.DataFrame({
            "id": [f"r{i}" for i in range(n)], "text": [f"t{i}" for i in range(n)], "fields": [{}] * n,
            "split": splits, "label": [None if s == "pool" else i % 2 for i, s in enumerate(splits)]}))
    return store


def test_round_trip_matches_a_plain_model_across_chunks(tmp_path, small_chunks):
    rng = np.random.default_rng(0)
    splits = list(rng.choice(["pool", "dev", "test"], size=23))
    store = workspace(tmp_path, splits)
    annotators = ["a", "b", "c"]
    model = {a: np.full(len(splits), ABSTAIN) for a in annotators}
    for round_ in range(3):  # later runs replace earlier ones split by split
        for a in annotators:
            for split in ("pool", "dev", "test"):
                rows = [i for i, s in enumerate(splits) if s == split]
                votes = rng.choice([ABSTAIN, ABSTAIN, 0, 1, 2], size=len(rows))
                if a == "c" and round_ == 2:
                    votes[:] = ABSTAIN  # every row abstains: the chunks are dropped, reads still abstain
                store.save_votes(a, split, [f"r{i}" for i in rows], votes)
                model[a][rows] = votes
    expected = np.stack([model[a] for a in annotators], axis=1)
    everything = store.vote_matrix(annotators)
    assert everything.example_ids == tuple(f"r{i}" for i in range(len(splits)))
    np.testing.assert_array_equal(everything.votes, expected)
    for split in ("pool", "dev", "test"):
        rows = [i for i, s in enumerate(splits) if s == split]
        np.testing.assert_array_equal(store.vote_matrix(annotators[::-1], split).votes, expected[rows][:, ::-1])
    shuffled = rng.permutation(len(splits))
    picked = store.vote_matrix(annotators, example_ids=[f"r{i}" for i in shuffled] + ["nobody"])
    np.testing.assert_array_equal(picked.votes[:-1], expected[shuffled])
    assert (picked.votes[-1] == ABSTAIN).all()
    assert store.vote_matrix(["a", "never-ran"], "dev").votes[:, 1].tolist() == [ABSTAIN] * splits.count("dev")
    assert store._q("SELECT count(*) FROM vote_chunks WHERE annotator_id = 'c'")[0][0] == 0


def test_class_ids_past_int8_widen_the_chunk(tmp_path):
    store = workspace(tmp_path, ["pool"] * 3)
    store.save_votes("a", "pool", ["r0", "r1", "r2"], np.array([5, ABSTAIN, 6]))
    store.add_votes("a", ["r1"], np.array([300]))
    store.add_votes("b", ["r2"], np.array([70_000]))
    np.testing.assert_array_equal(store.vote_matrix(["a", "b"], "pool").votes,
                                  [[5, ABSTAIN], [300, ABSTAIN], [6, 70_000]])
    assert store._q("SELECT annotator_id, width FROM vote_chunks ORDER BY 1") == [("a", 2), ("b", 4)]
    with pytest.raises(ValueError):
        store.add_votes("a", ["r0"], np.array([-2]))


def test_votes_for_rows_the_workspace_lacks_are_refused(tmp_path):
    store = workspace(tmp_path, ["pool", "dev"])
    with pytest.raises(KeyError, match="nobody"):
        store.save_votes("a", "pool", ["r0", "nobody"], np.array([1, 1]))
    with pytest.raises(ValueError):
        store.save_votes("a", "pool", ["r0"], np.array([1, 1]))
    assert store._q("SELECT count(*) FROM vote_chunks")[0][0] == 0  # nothing half-written
    assert "pool" not in store.voted_splits("a")


def test_rows_moving_into_dev_keep_their_votes_and_leave_the_pool(tmp_path, small_chunks):
    store = workspace(tmp_path, ["dev", "pool", "pool", "dev", "pool", "pool", "test"])
    pool_ids = ["r1", "r2", "r4", "r5"]
    store.save_votes("a", "pool", pool_ids, np.array([1, 0, 1, 0]))
    store.save_votes("a", "dev", ["r0", "r3"], np.array([0, 1]))
    assert store.vote_matrix(["a"], "pool").example_ids == tuple(pool_ids)  # both splits' rows now cached
    assert store.vote_matrix(["a"], "dev").example_ids == ("r0", "r3")
    before = store.count_examples()

    assert store.move_to_dev([("r2", 1, None), ("r5", 0, None)], by="expert") == 2
    assert store.count_examples() == before  # the row count alone could not tell the cache it is stale
    dev = store.vote_matrix(["a"], "dev")
    assert dev.example_ids == ("r0", "r2", "r3", "r5")
    assert dev.votes[:, 0].tolist() == [0, 0, 1, 0]  # the pool run's votes came along
    pool = store.vote_matrix(["a"], "pool")
    assert pool.example_ids == ("r1", "r4")
    # re-running on the pool replaces the votes of the rows in it now, not of the rows that left
    store.save_votes("a", "pool", ["r1", "r4"], np.array([ABSTAIN, ABSTAIN]))
    assert store.vote_matrix(["a"], "dev").votes[:, 0].tolist() == [0, 0, 1, 0]
    # an annotator that never ran on the pool gets its votes on the moved rows alone
    store.save_votes("b", "dev", ["r0", "r3"], np.array([1, 1]))
    store.add_votes("b", ["r2", "r5"], np.array([0, ABSTAIN]))
    assert store.vote_matrix(["b"], "fitness").votes[:, 0].tolist() == [1, 0, 1, ABSTAIN]
    # a row asked for with a split it is not in abstains
    assert store.vote_matrix(["a"], "pool", example_ids=["r2", "r1"]).votes[:, 0].tolist() == [ABSTAIN, ABSTAIN]


def test_a_rolled_back_move_leaves_no_stale_split_rows(tmp_path):
    """The cache's key is a token written with every move: a move rolled back after the cache was filled
    from inside it must not be mistaken for a later, different move."""
    store = workspace(tmp_path, ["dev", "pool", "pool"])
    assert store.split_rows("dev")[0].tolist() == ["r0"]
    with pytest.raises(RuntimeError), store.transaction():
        store._q("UPDATE examples SET split = 'dev' WHERE id = 'r1'")
        store._bump_rows_version()
        assert store.split_rows("dev")[0].tolist() == ["r0", "r1"]  # seen inside the transaction only
        raise RuntimeError("abandoned")
    assert store.split_rows("dev")[0].tolist() == ["r0"]
    store.move_to_dev([("r2", 1, None)], by="expert")
    assert store.split_rows("dev")[0].tolist() == ["r0", "r2"]
    assert store.split_rows("pool")[0].tolist() == ["r1"]


def test_new_rows_are_seen_by_the_next_read(tmp_path):
    store = workspace(tmp_path, ["pool"])
    store.save_votes("a", "pool", ["r0"], np.array([1]))
    assert store.vote_matrix(["a"], "pool").votes.tolist() == [[1]]
    store.add_examples("more", "memory", pd.DataFrame({"id": ["s0"], "text": ["u"], "fields": [{}],
                                                       "split": ["pool"], "label": [None]}))
    assert store.vote_matrix(["a"], "pool").example_ids == ("r0", "s0")
    assert store.vote_matrix(["a"], "pool").votes[:, 0].tolist() == [1, ABSTAIN]


def test_zero_and_one_row_workspaces(tmp_path):
    empty = Store.open(tmp_path / "empty")
    assert empty.vote_matrix(["a"], "pool").votes.shape == (0, 1)
    assert empty.vote_matrix([], None).votes.shape == (0, 0)
    empty.save_votes("a", "pool", [], np.zeros(0, dtype=np.int64))
    assert empty.voted_splits("a")["pool"]["n"] == 0

    one = workspace(tmp_path, ["dev"])
    one.save_votes("a", "dev", ["r0"], np.array([ABSTAIN]))
    one.save_votes("a", "test", [], np.zeros(0, dtype=np.int64))  # a split with no rows
    assert one.vote_matrix(["a"], "dev").votes.tolist() == [[ABSTAIN]]
    assert one.vote_matrix(["a"], "test").votes.shape == (0, 1)
    one.save_votes("b", "dev", ["r0"], np.array([1]))
    assert one.vote_matrix(["a", "b"]).votes.tolist() == [[ABSTAIN, 1]]
    assert one.vote_matrix([], "dev").votes.shape == (1, 0)


def old_workspace(tmp_path, rows: int) -> tuple[np.ndarray, list[str]]:
    """A workspace file as the store wrote it before migration 007: migrations 001-006, one row per vote,
    including a doubled vote (a killed write) and a vote for an id that is no row. Returns the votes it holds."""
    (tmp_path / "old").mkdir()
    con = duckdb.connect(str(tmp_path / "old" / DB_NAME))
    con.execute("CREATE TABLE _migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
    for name, sql in MIGRATIONS[:6]:
        assert isinstance(sql, str), name
        con.execute(sql)
        con.execute("INSERT INTO _migrations VALUES (?, now())", [name])
    rng = np.random.default_rng(1)
    splits = rng.choice(["pool", "dev", "test"], size=rows)
    ids = [f"x{i}" for i in range(rows)]
    con.execute("INSERT INTO examples (id, ord, text, fields, split, label, dataset) "
                "SELECT 'x' || i, i, 't' || i, '{}', s, NULL, 'old' FROM (SELECT unnest(?) AS s, "
                "generate_subscripts(?, 1) - 1 AS i)", [list(splits), list(splits)])
    annotators = ["p", "q"]
    votes = np.where(rng.random((rows, 2)) < 0.3, rng.integers(0, 4, (rows, 2)), ABSTAIN)
    votes[0, 0] = 3  # the row whose vote is doubled below
    for j, a in enumerate(annotators):
        fired = np.flatnonzero(votes[:, j] != ABSTAIN)
        frame = pd.DataFrame({"annotator_id": a, "example_id": [ids[i] for i in fired],
                              "vote": votes[fired, j].astype(np.int32)})
        con.register("incoming", frame)
        con.execute("INSERT INTO votes SELECT * FROM incoming")
        con.unregister("incoming")
        for split in ("pool", "dev", "test"):
            con.execute("INSERT INTO vote_runs VALUES (?, ?, ?, 0, NULL, 0.5)",
                        [a, split, int((splits == split).sum())])
    con.execute("INSERT INTO votes VALUES ('p', 'x0', 3)")  # doubled
    con.execute("INSERT INTO votes VALUES ('p', 'gone', 2)")  # no such row
    con.close()
    return votes, annotators


@pytest.mark.parametrize("rows", [0, 1, 300])
def test_an_old_workspace_upgrades_losing_no_vote(tmp_path, monkeypatch, rows):
    monkeypatch.setattr(vote_codes, "CHUNK_ROWS", 64)  # 300 rows: five chunks, the last one short
    if rows == 0:
        (tmp_path / "old").mkdir()
        con = duckdb.connect(str(tmp_path / "old" / DB_NAME))
        con.execute("CREATE TABLE _migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
        for name, sql in MIGRATIONS[:6]:
            con.execute(sql)
            con.execute("INSERT INTO _migrations VALUES (?, now())", [name])
        con.close()
        votes, annotators = np.zeros((0, 2), dtype=np.int64), ["p", "q"]
    else:
        votes, annotators = old_workspace(tmp_path, rows)
    store = Store.open(tmp_path / "old")
    tables = {r[0] for r in store._q("SELECT table_name FROM information_schema.tables")}
    assert "votes" not in tables and "vote_chunks" in tables
    assert store._q("SELECT count(*) FROM _migrations")[0][0] == len(MIGRATIONS)
    np.testing.assert_array_equal(store.vote_matrix(annotators).votes, votes)
    if rows:
        assert store.voted_splits("p")["dev"]["seconds"] == 0.5  # the runs' records are untouched
        # and the upgraded workspace works on: a move, then a re-run on the pool
        pool_ids = store.split_rows("pool")[0].tolist() or ["x0"]
        store._q("UPDATE examples SET split = 'pool' WHERE id = ?", [pool_ids[0]])  # one pool row at least
        store._bump_rows_version()
        store.move_to_dev([(pool_ids[0], 0, None)], by="expert")
        assert pool_ids[0] in store.split_rows("dev")[0].tolist()
        moved_place = int(pool_ids[0][1:])
        assert store.vote_matrix(["p"], "dev", example_ids=[pool_ids[0]]).votes[0, 0] == votes[moved_place, 0]
    Store.close_all()
    again = Store.open(tmp_path / "old")  # reopening does not migrate twice
    np.testing.assert_array_equal(again.vote_matrix(annotators, "test").votes,
                                  votes[[i for i, s in enumerate(again._q("SELECT split FROM examples ORDER BY ord"))
                                         if s[0] == "test"]] if rows else votes[:0])
