"""The student stage: a text model learns from a teacher's labels of the unlabeled rows, and auto may pick it.

Data: two classes, each written with its own words, plus shared filler. Dev holds a few rows; the pool holds
many. A keyword annotator (the "pool") votes on most rows, so majority vote is a good teacher there.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.aggregators.base import class_prior
from engine.aggregators.choice_names import describe_choice, reads_votes
from engine.aggregators.features import TfidfFeatures
from engine.aggregators.student import (
    StudentAggregator,
    frequent_columns,
    prior_bias,
    shift_sample,
    shifted,
)
from engine.aggregators.voting import MajorityVote
from engine.domain import ABSTAIN
from engine.metrics.score import macro_f1

WORDS = (["refund", "money", "charge", "payment", "bank", "card", "fee", "cash"],
         ["goal", "match", "team", "score", "league", "coach", "player", "season"])
FILLER = ["the", "a", "today", "really", "about", "my", "this", "again"]


def corpus(n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray, np.ndarray]:
    """n texts, their classes, and one keyword annotator's votes (it knows two words per class)."""
    y = rng.integers(0, 2, size=n)
    texts, votes = [], np.full((n, 1), ABSTAIN)
    for i, c in enumerate(y):
        words = list(rng.choice(WORDS[c], size=2)) + list(rng.choice(FILLER, size=3))
        if rng.random() < 0.15:  # some noise: a word of the other class
            words.append(str(rng.choice(WORDS[1 - c])))
        rng.shuffle(words)
        texts.append(" ".join(words))
        for label in (0, 1):
            if any(w in WORDS[label][:2] for w in words):
                votes[i, 0] = label
    return texts, y, votes


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    texts, y, votes = corpus(2000, rng)
    X = {"tfidf": TfidfFeatures(min_df=1).fit_transform(texts)}
    dev, pool, test = np.arange(12), np.arange(12, 1500), np.arange(1500, 2000)
    return X, y, votes, dev, pool, test


def rows(X: dict, idx: np.ndarray) -> dict:
    return {name: m[idx] for name, m in X.items()}


def test_student_learns_from_the_teachers_labels_of_the_unlabeled_rows(data):
    X, y, votes, dev, pool, test = data
    alone = StudentAggregator(2, lambda: MajorityVote(2), "mv", ("tfidf",)).fit(votes[dev], y[dev], rows(X, dev))
    taught = StudentAggregator(2, lambda: MajorityVote(2), "mv", ("tfidf",)).fit(
        votes[dev], y[dev], rows(X, dev), unlabeled_votes=votes[pool], unlabeled_X=rows(X, pool))
    assert alone.n_pseudo_ == 0 and taught.n_pseudo_ == len(pool)
    f1_alone = macro_f1(y[test], alone.predict(votes[test], rows(X, test)), 2)
    f1_taught = macro_f1(y[test], taught.predict(votes[test], rows(X, test)), 2)
    teacher = MajorityVote(2).fit(votes[dev], y[dev])
    f1_teacher = macro_f1(y[test], np.where((votes[test] != ABSTAIN).any(axis=1),
                                            teacher.predict(votes[test]), ABSTAIN), 2)
    assert f1_taught > f1_alone + 0.05  # thousands of pseudo-labeled rows beat a dozen gold ones
    assert f1_taught > f1_teacher  # and the student labels the rows the teacher cannot reach
    # the student reads only the text: the votes of the rows it labels change nothing
    silent = np.full_like(votes[test], ABSTAIN)
    assert np.allclose(taught.predict_proba(silent, rows(X, test)), taught.predict_proba(votes[test], rows(X, test)))


def test_rows_no_annotator_votes_on_teach_nothing_under_a_teacher_that_reads_only_the_votes(data):
    """Majority vote answers dev's class prior where nobody votes: on an unbalanced dev that named the largest class
    with weight 0.5 on every such row, so the student learnt "no vote: class 0". Those rows now teach nothing, as
    rows with no votes at all teach nothing; a teacher that reads text knows something of every row."""
    from engine.aggregators.evoagg import EvoAgg
    from engine.aggregators.student import reads_text

    X, y, votes, dev, pool, test = data
    dev = np.concatenate([np.flatnonzero(y == 0)[:9], np.flatnonzero(y == 1)[:3]])  # 3 to 1
    pool = np.setdiff1d(pool, dev)
    silent = np.full_like(votes[pool], ABSTAIN)

    def student(**unlabeled):
        return StudentAggregator(2, lambda: MajorityVote(2), "mv", ("tfidf",)).fit(
            votes[dev], y[dev], rows(X, dev), **unlabeled)

    alone, taught = student(), student(unlabeled_votes=silent, unlabeled_X=rows(X, pool))
    assert taught.n_pseudo_ == len(pool)
    test_X = rows(X, test)
    assert np.allclose(alone.predict_proba(votes[test], test_X), taught.predict_proba(votes[test], test_X))
    assert not reads_text(MajorityVote(2)) and not reads_text(EvoAgg(2, feature=None))
    assert reads_text(EvoAgg(2, feature="tfidf"))


def test_student_keeps_only_the_most_frequent_sparse_columns(data):
    X = data[0]["tfidf"]
    (kept,) = frequent_columns([X], limit=5)
    df = np.bincount(X.indices, minlength=X.shape[1])
    assert len(kept) == 5 and df[kept].min() >= np.sort(df)[-5]
    assert frequent_columns([X], limit=X.shape[1]) is None
    # a dense block (embeddings) is kept whole and counts against the limit
    dense = np.ones((X.shape[0], 3))
    whole, sparse_kept = frequent_columns([dense, X], limit=8)
    assert whole is None and np.array_equal(sparse_kept, kept)
    assert frequent_columns([dense], limit=2) is None  # only dense views: nothing to drop, whatever the limit


def test_block_lr_is_scikit_learns_logistic_regression():
    """The student's solver (dense and sparse blocks side by side) fits the model scikit-learn fits on the
    stacked matrix: same objective, start and optimizer, so the same probabilities and step count."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    from engine.aggregators.block_lr import BlockLogisticRegression

    rng = np.random.default_rng(0)
    for k in (2, 4):
        D = rng.standard_normal((300, 20))
        S = sparse.random(300, 150, density=0.05, format="csr", random_state=1)
        y = (D[:, :k] + rng.standard_normal((300, k))).argmax(axis=1)
        w = rng.uniform(0.2, 3.0, 300)
        stacked = sparse.hstack([sparse.csr_matrix(D), S], format="csr")
        ours = BlockLogisticRegression(C=10.0, max_iter=300).fit([D, S], y, w)
        theirs = LogisticRegression(C=10.0, max_iter=300).fit(stacked, y, sample_weight=w)
        assert np.abs(ours.predict_proba([D, S]) - theirs.predict_proba(stacked)).max() < 1e-6
        assert ours.n_iter_ == int(theirs.n_iter_[0])


def test_reads_votes_follows_averages_and_teachers():
    assert reads_votes("mv") and reads_votes("evoagg[embedding]") and not reads_votes("tfidf-only")
    assert reads_votes("avg(tfidf-only,evoagg[tfidf])") and not reads_votes("avg(tfidf-only,embedding-only)")
    assert reads_votes("student<avg(tfidf-only,ds)>[embedding+tfidf]")
    assert not reads_votes("student<embedding-only>")


def test_prior_bias_brings_the_picked_class_shares_to_the_target():
    rng = np.random.default_rng(0)
    # three classes; class 2 is almost never the argmax although it is a third of the target
    proba = rng.dirichlet([4.0, 4.0, 1.0], size=3000)
    target = np.array([0.4, 0.3, 0.3])
    before = np.bincount(proba.argmax(axis=1), minlength=3) / len(proba)
    bias = prior_bias(proba, target)
    after = np.bincount(shifted(proba, bias).argmax(axis=1), minlength=3) / len(proba)
    assert before[2] < 0.1 and abs(after[2] - 0.3) < 0.03 and np.abs(after - target).max() < 0.03
    assert abs(bias.mean()) < 1e-9 and bias[2] == bias.max()
    assert np.allclose(shifted(proba, bias).sum(axis=1), 1.0)
    assert np.allclose(shifted(proba, np.zeros(3)), proba)  # no offset: the same probabilities
    assert np.array_equal(prior_bias(proba[:0], target), np.zeros(3))  # nothing to match on: no offset


def test_the_offsets_target_devs_class_shares_add_one_smoothed():
    assert np.allclose(class_prior(np.array([0, 0, 1]), 3), [3 / 6, 2 / 6, 1 / 6])


def test_a_student_predicts_with_the_shifted_shares_only_when_asked(data):
    X, y, votes, dev, pool, test = data
    student = StudentAggregator(2, lambda: MajorityVote(2), "mv", ("tfidf",)).fit(
        votes[dev], y[dev], rows(X, dev), unlabeled_votes=votes[pool], unlabeled_X=rows(X, pool))
    raw = student.predict_proba(votes[test], rows(X, test))
    assert student.match_prior is False and student.prior_bias_.shape == (2,)
    assert np.allclose(student.predict_proba(votes[test], rows(X, test), match_prior=True),
                       shifted(raw, student.prior_bias_))
    student.match_prior = True
    assert np.allclose(student.predict_proba(votes[test], rows(X, test)), shifted(raw, student.prior_bias_))


def test_the_offsets_are_fitted_on_unlabeled_rows_the_student_did_not_learn_from(data):
    """On its own sample the student is surer of its teacher's classes, so offsets fitted there overshoot on new
    rows: when the unlabeled rows outnumber its sample, they are fitted on rows outside it."""
    X, y, votes, dev, pool, test = data
    student = StudentAggregator(2, lambda: MajorityVote(2), "mv", ("tfidf",), max_unlabeled=500).fit(
        votes[dev], y[dev], rows(X, dev), unlabeled_votes=votes[pool], unlabeled_X=rows(X, pool))
    learnt = student.unlabeled_rows(len(pool))
    shift = shift_sample(len(pool), 0, learnt)
    assert len(learnt) == 500 and len(shift) == len(pool) - 500 and not np.intersect1d(shift, learnt).size
    unseen = student.predict_proba(votes[pool[shift]], rows(X, pool[shift]), match_prior=False)
    assert np.allclose(student.prior_bias_, prior_bias(unseen, class_prior(y[dev], 2)))
    on_sample = student.predict_proba(votes[pool[learnt]], rows(X, pool[learnt]), match_prior=False)
    assert not np.allclose(student.prior_bias_, prior_bias(on_sample, class_prior(y[dev], 2)))  # not its own rows
    assert len(shift_sample(10, 0, np.arange(10))) == 0  # the sample holds every row: nothing outside it
    assert len(shift_sample(10_000, 0, np.arange(10), limit=300)) == 300


def test_names_say_whether_a_student_reads_the_votes_itself():
    from engine.aggregators.choice_names import is_student, reads_votes_at_prediction

    assert reads_votes("student+votes<tfidf-only>") and reads_votes_at_prediction("student+votes<tfidf-only>")
    # a student of a vote reader reads the votes through its teacher only: at prediction it reads text
    assert reads_votes("student<evoagg[tfidf]>") and not reads_votes_at_prediction("student<evoagg[tfidf]>")
    mean = "avg(student<evoagg[tfidf]>,student<tfidf-only>,student+votes<tfidf-only>)"
    assert reads_votes(mean) and reads_votes_at_prediction(mean) and is_student("student+votes<x-only>")
    assert not reads_votes_at_prediction("avg(student<evoagg[tfidf]>,student<tfidf-only>)")
    assert "pool's votes" in describe_choice("student+votes<tfidf-only>")
    assert "pool's votes" not in describe_choice("student<tfidf-only>").split("; the teacher")[0]


def test_a_student_that_reads_the_votes_learns_from_the_unlabeled_rows_how_far_to_trust_them():
    """Text that barely tells the classes apart, an annotator right on 95 % of the rows it fires on (70 % of them) and
    a teacher right on 75 % of the rows, its errors independent of the annotator's: the votes agree with the
    teacher's labels far more often than chance, so a student that reads them learns to follow them; one that reads
    the text alone cannot."""
    rng = np.random.default_rng(3)
    n, k = 3000, 2
    y = rng.integers(0, k, n)
    X = {"embedding": rng.normal(size=(k, 16))[y] * 0.15 + rng.normal(size=(n, 16))}
    votes = np.full((n, 1), ABSTAIN)
    fires = rng.random(n) < 0.7
    votes[fires, 0] = np.where(rng.random(fires.sum()) < 0.95, y[fires], 1 - y[fires])
    taught = np.where(rng.random(n) < 0.75, y, 1 - y)

    class Teacher:  # its labels of the unlabeled rows, row for row
        def predict_proba(self, v, X_):
            return np.eye(k)[taught[pool]] * 0.8 + 0.1

    dev, pool, test = np.arange(100), np.arange(100, 2500), np.arange(2500, n)
    f1 = {}
    for weight in (0.0, 0.25):
        student = StudentAggregator(k, lambda: None, "teacher", ("embedding",), seed=0, vote_weight=weight)
        student.fit_from_teacher(Teacher(), votes[dev], y[dev], rows(X, dev), votes[pool], rows(X, pool))
        f1[weight] = macro_f1(y[test], student.predict_proba(votes[test], rows(X, test)).argmax(1), k)
        shuffled = votes[test][::-1]
        moved = not np.allclose(student.predict_proba(shuffled, rows(X, test)),
                                student.predict_proba(votes[test], rows(X, test)))
        assert moved is (weight > 0)  # the plain student reads text alone
    assert f1[0.0] < 0.75 < 0.85 < f1[0.25]


def test_a_students_vote_block_is_kept_whole_when_text_columns_are_dropped(data):
    """The student keeps only its most frequent sparse text columns; the votes' columns are not among those that
    compete (an annotator that fires rarely would lose its columns without a word)."""
    X, y, votes, dev, pool, test = data
    wide = np.column_stack([votes, np.where(np.arange(len(y)) % 50 == 0, y, ABSTAIN)])  # a rare second annotator
    student = StudentAggregator(2, lambda: None, "mv", ("tfidf",), seed=0, max_columns=20, vote_weight=0.25)
    student.fit_from_teacher(MajorityVote(2).fit(wide[dev], y[dev]), wide[dev], y[dev], rows(X, dev), wide[pool],
                             rows(X, pool))
    assert len(student.columns_) == 2 and len(student.columns_[0]) == 20 and student.columns_[1] is None
    assert student.model_.coefs_[1].shape[0] == 2 * 2  # every annotator's column per class


