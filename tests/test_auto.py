"""auto: a few candidates, judged on rows that can judge them, and an estimate never measured where it chose."""
import numpy as np
import pytest

from engine.aggregators.auto import AutoAggregator
from engine.aggregators.base import make_folds, oof_proba
from engine.aggregators.choice_names import reads_votes
from engine.aggregators.evoagg import EvoAgg
from engine.domain import ABSTAIN
from engine.metrics.score import macro_f1

K = 3


def text_of(y: np.ndarray, signal: float, rng: np.random.Generator) -> np.ndarray:
    """Embeddings that say the class with strength `signal` (0: pure noise)."""
    return signal * np.eye(K)[y] + rng.normal(0, 1.0, (len(y), K))


def selected_votes(y: np.ndarray, fitness: np.ndarray, rng: np.random.Generator, m: int = 6) -> np.ndarray:
    """Annotators a gate kept for being right on the fitness rows: they copy the label there, and are noise
    everywhere else (the pool's selection bias, planted)."""
    votes = rng.integers(ABSTAIN, K, (len(y), m))
    votes[fitness] = np.repeat(y[fitness, None], m, axis=1)
    return votes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_estimate_is_not_the_inflated_figure_of_rows_the_pool_was_chosen_on(seed):
    rng = np.random.default_rng(seed)
    n = 400
    y = rng.integers(0, K, n)
    audit = np.zeros(n, dtype=bool)
    audit[rng.permutation(n)[:150]] = True
    votes = selected_votes(y, ~audit, rng)
    X = {"embedding": text_of(y, 1.0, rng)}
    auto = AutoAggregator(K, seed=0).fit(votes, y, X, audit=audit, votes_selected=True)
    # the truth: new rows, where the selected annotators are noise
    y_new = rng.integers(0, K, 3000)
    truth = macro_f1(y_new, auto.predict(rng.integers(ABSTAIN, K, (3000, 6)), {"embedding": text_of(y_new, 1.0, rng)}),
                     K)
    # what choosing and reporting on every dev row says: EvoAgg out of fold, where the votes were chosen to be right
    trap = macro_f1(y, oof_proba(lambda: EvoAgg(K, seed=0), votes, y, X, make_folds(y, 5, 0)).argmax(axis=1), K)
    assert trap > truth + 0.15
    assert abs(auto.estimate_.macro_f1 - truth) < 0.08
    assert auto.estimate_.low - 0.02 <= truth <= auto.estimate_.high + 0.02
    assert auto.estimate_.judged_on == "audit"


def test_without_audit_rows_nothing_that_reads_selected_votes_is_weighed():
    rng = np.random.default_rng(1)
    n = 300
    y = rng.integers(0, K, n)
    votes = selected_votes(y, np.ones(n, dtype=bool), rng)  # perfect on every dev row: it would win anywhere
    auto = AutoAggregator(K, seed=0).fit(votes, y, {"embedding": text_of(y, 1.5, rng)}, votes_selected=True)
    assert not reads_votes(auto.chosen_) and not auto.uses_votes_
    assert all(not reads_votes(name) for name in auto.oof_scores_)
    assert auto.estimate_ is not None and auto.estimate_.judged_on == "dev"


def test_a_clear_winner_is_taken_alone_and_a_tie_is_averaged():
    rng = np.random.default_rng(2)
    n = 300
    y = rng.integers(0, K, n)
    good_votes = np.repeat(y[:, None], 4, axis=1)  # not selected on dev: judged on every row
    good_votes[rng.random((n, 4)) < 0.1] = ABSTAIN
    weak_text = {"embedding": text_of(y, 0.5, rng)}
    clear = AutoAggregator(K, seed=0).fit(good_votes, y, weak_text, votes_selected=False)
    assert reads_votes(clear.chosen_) and not clear.chosen_.startswith("avg(avg(")
    assert clear.oof_scores_[clear.chosen_] > clear.oof_scores_["embedding-only"] + 0.2
    strong_text = {"embedding": text_of(y, 8.0, rng)}  # text and votes both near perfect: no evidence between them
    tie = AutoAggregator(K, seed=0).fit(good_votes, y, strong_text, votes_selected=False)
    assert tie.chosen_.startswith("avg(") and len(tie.members_) == 2


def test_auto_text_reads_no_votes_and_auto_pool_reads_them():
    rng = np.random.default_rng(3)
    n = 300
    y = rng.integers(0, K, n)
    audit = np.arange(n) < 100
    votes = np.where(rng.random((n, 5)) < 0.7, y[:, None], ABSTAIN)
    X = {"embedding": text_of(y, 1.0, rng)}
    text = AutoAggregator(K, seed=0, text_only=True).fit(votes, y, X, audit=audit, votes_selected=True)
    pool = AutoAggregator(K, seed=0, pool_only=True).fit(votes, y, X, audit=audit, votes_selected=True)
    assert not reads_votes(text.chosen_) and reads_votes(pool.chosen_)
    shuffled = rng.permutation(votes, axis=0)
    assert np.allclose(text.predict_proba(votes, X), text.predict_proba(shuffled, X))
    assert not np.allclose(pool.predict_proba(votes, X), pool.predict_proba(shuffled, X))


def test_students_are_weighed_given_unlabeled_rows_and_the_kept_one_predicts_from_text():
    rng = np.random.default_rng(4)
    n, u = 200, 1500
    y, y_unl = rng.integers(0, K, n), rng.integers(0, K, u)
    votes = np.where(rng.random((n, 5)) < 0.6, y[:, None], ABSTAIN)
    unl_votes = np.where(rng.random((u, 5)) < 0.6, y_unl[:, None], ABSTAIN)
    X, X_unl = {"embedding": text_of(y, 1.0, rng)}, {"embedding": text_of(y_unl, 1.0, rng)}
    auto = AutoAggregator(K, seed=0).fit(votes, y, X, unlabeled_votes=unl_votes, unlabeled_X=X_unl)
    students = [name for name in auto.oof_scores_ if name.startswith("student<")]
    assert len(students) == 2  # one of the text, one of the pool
    proba = auto.predict_proba(votes, X)
    assert proba.shape == (n, K) and np.allclose(proba.sum(axis=1), 1.0)


def test_the_choice_and_the_estimate_do_not_move_with_the_worker_count():
    rng = np.random.default_rng(5)
    n = 250
    y = rng.integers(0, K, n)
    votes = np.where(rng.random((n, 4)) < 0.6, y[:, None], ABSTAIN)
    X = {"embedding": text_of(y, 1.0, rng)}
    one = AutoAggregator(K, seed=0, n_jobs=1).fit(votes, y, X)
    two = AutoAggregator(K, seed=0, n_jobs=2).fit(votes, y, X)
    assert one.chosen_ == two.chosen_ and one.estimate_ == two.estimate_


def test_refuses_what_it_cannot_do():
    votes, y = np.zeros((10, 2), dtype=int), np.zeros(10, dtype=int)
    with pytest.raises(ValueError, match="y is required"):
        AutoAggregator(K).fit(votes, None)
    with pytest.raises(ValueError, match="exclude each other"):
        AutoAggregator(K, text_only=True, pool_only=True).fit(votes, y)
    with pytest.raises(ValueError, match="text features"):
        AutoAggregator(K, text_only=True).fit(votes, y)
