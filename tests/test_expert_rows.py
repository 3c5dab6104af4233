"""Rows the expert labels join dev (who and when recorded, votes and scores brought up to date), and the
regression list names the dev rows the labels get wrong. Real DuckDB workspace, real sandbox, offline agents."""
from __future__ import annotations

import numpy as np
import pytest

from engine.agents.offline.proposer import OfflineProposer
from engine.domain import ABSTAIN, FITNESS
from engine.evolve import evolve
from engine.expert.rows import label_rows, regression_rows, rows_of_class, similar_rows, unlabel_rows
from engine.ingest.importer import import_path
from engine.labeling.fit import soft_labels
from engine.metrics.score import score_annotator
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store


@pytest.fixture
def evolved(store, demo_csv):
    import_path(store, demo_csv)
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
        yield store, executor


def test_labeled_pool_rows_join_dev_with_who_and_when_and_every_figure_follows(evolved):
    store, executor = evolved
    fitness_before = store.count_examples(FITNESS)
    test_before = store.example_ids("test")
    pool = store.examples_frame("pool", limit=3)
    chosen = {pool["id"][0]: "SPAM", pool["id"][1]: "HAM", pool["id"][2]: "SPAM", test_before[0]: "HAM"}
    moved = label_rows(store, executor, chosen, by="maria", note="from the regression list")
    assert moved == list(pool["id"])  # the test row is not touched: holdout stays holdout
    assert store.count_examples(FITNESS) == fitness_before + 3 and store.example_ids("test") == test_before
    labels = store.load_task().labels
    dev = store.examples_frame("dev", ids=moved).set_index("id")
    assert [labels[int(dev.loc[i, "label"])] for i in moved] == ["SPAM", "HAM", "SPAM"]
    record = store.expert_labels()
    assert set(record["example_id"]) == set(moved)
    assert set(record["labeled_by"]) == {"maria"} and record["labeled_at"].notna().all()
    assert set(record["note"]) == {"from the regression list"} and set(record["from_split"]) == {"pool"}

    # every pool member has its real vote on the new rows (a fresh sandbox run gives the same) and its stored
    # score is the one recomputed on the grown fitness rows
    members = store.pool_ids()
    stored = store.vote_matrix(members, FITNESS, example_ids=moved).votes
    frame = store.examples_frame("dev", ids=moved)
    inputs = [{**f, "text": t} for f, t in zip(frame["fields"], frame["text"], strict=True)]
    fresh = executor.run(store.annotators(members), inputs, list(labels))
    by_id = {r.annotator_id: r.votes for r in fresh}
    for j, member in enumerate(members):
        position = {i: k for k, i in enumerate(frame["id"])}
        assert [int(v) for v in stored[:, j]] == [int(by_id[member][position[i]]) for i in moved]
    votes = store.vote_matrix(members, FITNESS).votes
    for j, member in enumerate(members):
        expected = score_annotator(member, votes[:, j], store.gold(FITNESS))
        assert store.scores([member])[member].fires == expected.fires
        assert store.scores([member])[member].precision == pytest.approx(expected.precision)


def test_labeling_refuses_unknown_labels_and_a_missing_name(evolved):
    store, executor = evolved
    row = store.example_ids("pool")[0]
    with pytest.raises(ValueError, match="not in the label set"):
        label_rows(store, executor, {row: "EGGS"}, by="maria")
    with pytest.raises(ValueError, match="who labeled"):
        label_rows(store, executor, {row: "HAM"}, by=" ")
    assert row in store.example_ids("pool") and store.expert_labels().empty


def test_the_regression_list_is_the_dev_rows_the_labels_get_wrong(evolved):
    store, executor = evolved
    result = soft_labels(store, executor, "mv")
    wrong = regression_rows(store, result.soft.example_ids, result.soft.probs, result.hard)
    labels = store.load_task().labels
    position = {i: k for k, i in enumerate(result.soft.example_ids)}
    dev_ids, gold = store.example_ids("dev"), store.gold("dev")
    expected = {i for i, g in zip(dev_ids, gold, strict=True) if result.hard[position[i]] != g}
    assert set(wrong["id"]) == expected and len(expected) > 0
    for row in wrong.itertuples():
        h = result.hard[position[row.id]]
        assert row.predicted == (labels[h] if h != ABSTAIN else "") and row.gold != row.predicted
    assert list(wrong["confidence"]) == sorted(wrong["confidence"], reverse=True)
    like = similar_rows(store, wrong["text"][0], n=5)
    assert 0 < len(like) <= 5 and set(like["id"]) <= set(store.example_ids("pool"))
    assert np.all(np.diff(like["similarity"].to_numpy()) <= 0)


def test_the_regression_list_leaves_the_audit_rows_out(tmp_path, demo_csv):
    """Labeling rows like a listed one feeds the fitness rows: an audit row listed there (with its gold label)
    would steer them toward the rows held back to check the pool."""
    import pandas as pd

    from engine.domain import AUDIT
    from engine.ingest.importer import IngestOptions

    no_splits = tmp_path / "no_splits.csv"
    pd.read_csv(demo_csv).drop(columns="split").to_csv(no_splits, index=False)
    store = Store.open(tmp_path / "ws")
    import_path(store, no_splits, IngestOptions(dev_size=300))
    audit = set(store.example_ids(AUDIT))
    assert audit
    ids = store.example_ids("dev")
    ham = np.zeros(len(ids), dtype=np.int64)  # every row called HAM: each SPAM row of dev is a mistake
    wrong = regression_rows(store, ids, np.eye(2)[ham], ham)
    spam_fitness = {i for i, g in zip(store.example_ids(FITNESS), store.gold(FITNESS), strict=True) if g == 1}
    assert set(wrong["id"]) == spam_fitness and not set(wrong["id"]) & audit


def test_the_record_survives_reopening(tmp_path, demo_csv):
    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv)
    with SandboxExecutor() as executor:
        label_rows(store, executor, {store.example_ids("pool")[0]: "HAM"}, by="li")
    Store.close_all()
    again = Store.open(tmp_path / "ws")
    assert list(again.expert_labels()["labeled_by"]) == ["li"]
    Store.close_all()


def test_unlabeling_returns_the_rows_to_the_pool_and_every_score_to_what_it_was(evolved):
    store, executor = evolved
    members = store.pool_ids()
    before = {m: store.scores([m])[m] for m in members}
    fitness_before, imported_dev = store.count_examples(FITNESS), store.example_ids("dev")
    pool = store.examples_frame("pool", limit=6)
    first = label_rows(store, executor, dict(zip(pool["id"][:4], ["SPAM", "HAM"] * 2, strict=True)), by="maria")
    second = label_rows(store, executor, dict(zip(pool["id"][4:], ["HAM", "SPAM"], strict=True)), by="maria")
    assert store.count_examples(FITNESS) == fitness_before + 6
    # an imported dev row is not the expert's to return; a row returned twice moves once
    assert unlabel_rows(store, [*second, imported_dev[0]]) == second
    assert unlabel_rows(store, second) == []
    assert set(store.expert_labels()["example_id"]) == set(first)
    assert unlabel_rows(store, first) == first
    assert store.example_ids("dev") == imported_dev and store.count_examples(FITNESS) == fitness_before
    assert set(pool["id"]) <= set(store.example_ids("pool")) and store.expert_labels().empty
    assert (store.examples_frame("pool", ids=list(pool["id"]))["label"].isna()).all()
    for member in members:
        after = store.scores([member])[member]
        assert (after.fires, after.correct) == (before[member].fires, before[member].correct)
        assert after.precision == pytest.approx(before[member].precision)


def test_labeling_a_row_then_another_after_an_undo_is_a_new_state_for_every_cache(evolved):
    from engine.store.saved_labels import _key_before_labels, pool_key, stale_reason
    from studio.workspace import version

    store, executor = evolved
    a, b = store.examples_frame("pool", limit=2)["id"]
    before = pool_key(store)
    label_rows(store, executor, {a: "SPAM"}, by="maria")
    after_a = (pool_key(store), version(store))
    unlabel_rows(store, [a])
    assert pool_key(store) == before  # the same rows as before: labels saved then are current again
    label_rows(store, executor, {b: "SPAM"}, by="maria")
    assert pool_key(store) != after_a[0] and version(store) != after_a[1]
    # the same row back with the other label: other dev rows, so labels saved before are stale (the key once held
    # only which rows the expert labeled)
    after_b = pool_key(store)
    unlabel_rows(store, [b])
    label_rows(store, executor, {b: "HAM"}, by="maria")
    assert pool_key(store) != after_b
    assert stale_reason(store, store.pool_ids(), after_b) is not None
    # labels saved under the key of before (ids alone) are not all called stale at the upgrade
    assert stale_reason(store, store.pool_ids(), _key_before_labels(store)) is None


def test_labeling_that_fails_midway_leaves_the_rows_unlabeled_and_every_score_as_it_was(evolved, monkeypatch):
    """The rows move to dev first, then votes and scores follow: a failure in between (a sandbox that dies, a full
    disk) returns them to the pool with their label and record dropped, and the stored scores are those of before."""
    import engine.expert.rows as expert_rows

    store, executor = evolved
    members = store.pool_ids()
    scores_before = {m: (s.fires, s.precision) for m, s in store.scores(members).items()}
    fitness_before = store.count_examples(FITNESS)
    pool = store.examples_frame("pool", limit=2)
    real = expert_rows.rescore_on_fitness
    calls = []

    def fails_once(store_, annotators):
        calls.append(len(annotators))
        if len(calls) == 1:
            real(store_, annotators[: len(annotators) // 2])  # half the scores written, then the failure
            raise OSError("disk full")
        real(store_, annotators)

    monkeypatch.setattr(expert_rows, "rescore_on_fitness", fails_once)
    with pytest.raises(OSError, match="disk full"):
        label_rows(store, executor, {pool["id"][0]: "SPAM", pool["id"][1]: "HAM"}, by="maria")
    assert store.count_examples(FITNESS) == fitness_before and store.expert_labels().empty
    assert set(pool["id"]) <= set(store.example_ids("pool"))
    assert {m: (s.fires, s.precision) for m, s in store.scores(members).items()} == scores_before


def test_a_labeling_whose_undo_fails_too_says_the_rows_are_in_dev(evolved, monkeypatch):
    """Should returning the rows fail as well (the same full disk), the error says where they are: in dev, to send
    back from the record, not that nothing was labeled."""
    import engine.expert.rows as expert_rows

    store, executor = evolved
    pool = store.examples_frame("pool", limit=1)

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(expert_rows, "rescore_on_fitness", broken)
    monkeypatch.setattr(store, "move_back_to_pool", broken)
    with pytest.raises(expert_rows.RowsLeftInDev, match=r"disk full.*1 row\(s\) are in dev"):
        label_rows(store, executor, {pool["id"][0]: "SPAM"}, by="maria")
    assert pool["id"][0] in set(store.example_ids("dev"))


def test_rows_of_a_class_are_the_unlabeled_rows_the_saved_labels_rank_highest_for_it(store, demo_csv):
    import_path(store, demo_csv)
    ids = store.example_ids()
    unlabeled = set(store.example_ids("pool"))
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1], size=len(ids))
    found = rows_of_class(store, 1, n=5, saved=(ids, probs))
    expected = [ids[i] for i in np.argsort(-probs[:, 1], kind="stable") if ids[i] in unlabeled][:5]
    assert list(found["id"]) == expected
    assert list(found["probability"]) == pytest.approx([probs[ids.index(i), 1] for i in expected], abs=1e-3)
    texts = store.examples_frame("pool", ids=expected).set_index("id")["text"]
    assert list(found["text"]) == [texts[i] for i in expected]
    # a row labeled into dev since the labels were saved is no longer offered
    with SandboxExecutor() as executor:
        label_rows(store, executor, {expected[0]: "SPAM"}, by="maria")
    assert list(rows_of_class(store, 1, n=4, saved=(ids, probs))["id"]) == expected[1:]


def test_without_soft_labels_rows_of_a_class_are_those_worded_like_its_dev_rows_or_its_name(store):
    import pandas as pd

    from engine.ingest.importer import IngestOptions, import_frame

    dev = [("refund my card please", "refund"), ("refund the fee", "refund"), ("where is my parcel", "delivery"),
           ("parcel late again", "delivery")]
    pool = ["please refund the card fee", "my parcel is late", "nice weather today", "the exchange rate is bad"]
    frame = pd.DataFrame({"id": [f"d{i}" for i in range(len(dev))] + [f"p{i}" for i in range(len(pool))],
                          "text": [t for t, _ in dev] + pool, "label": [c for _, c in dev] + [None] * len(pool),
                          "split": ["dev"] * len(dev) + ["pool"] * len(pool)})
    import_frame(store, frame, IngestOptions(audit_fraction=0.0, labels=("refund", "delivery", "exchange_rate")),
                 dataset="t", source="test")
    refund = rows_of_class(store, 0)
    assert refund["id"][0] == "p0" and "p2" not in set(refund["id"])  # a row sharing no word is left out
    assert list(refund["similarity"]) == sorted(refund["similarity"], reverse=True)
    assert rows_of_class(store, 1)["id"][0] == "p1"
    # a class without a dev row: its name's words find its rows, and its description's once given, also through a
    # likeness fitted before (the studio keeps one per state of the rows; a description changes none of them)
    from engine.expert.rows import PoolLikeness

    assert list(rows_of_class(store, 2)["id"]) == ["p3"]
    likeness = PoolLikeness(store)
    store.describe_label("exchange_rate", "nice weather")
    assert rows_of_class(store, 2, likeness=likeness)["id"][0] == "p2"
