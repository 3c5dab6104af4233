"""Scoring on tiny hand-computed vote matrices: majority vote, macro-F1, annotator fitness, pool analytics."""
from __future__ import annotations

import numpy as np
import pytest

from engine.domain import ABSTAIN
from engine.metrics.score import (
    accuracy,
    audit_and_fitness_f1,
    conflict_matrix,
    coverage_per_class,
    disagreement,
    macro_f1,
    majority_vote,
    marginal_contributions,
    overlap_matrix,
    per_class_f1,
    pool_macro_f1,
    score_annotator,
    vote_counts,
)

A = ABSTAIN


def test_majority_vote_ties_go_to_lowest_class_and_silent_rows_abstain():
    votes = np.array([
        [0, 0, 1],  # clear 0
        [1, A, 0],  # 1 vs 0 tie -> 0
        [A, A, A],  # nobody votes -> ABSTAIN
        [2, 1, 2],  # clear 2
        [A, 1, A],  # single vote
        [2, 1, A],  # 1 vs 2 tie -> 1
    ])
    assert majority_vote(votes, 3).tolist() == [0, 0, A, 2, 1, 1]


def test_vote_counts_rejects_out_of_range_votes():
    assert vote_counts(np.array([[0, 1, 1, A]]), 2).tolist() == [[1, 2]]
    with pytest.raises(ValueError, match="votes must lie"):
        vote_counts(np.array([[3]]), 2)


def test_macro_f1_counts_abstain_as_wrong():
    y_true = np.array([0, 0, 1, 1, 2])
    y_pred = np.array([0, A, 1, 0, A])
    # class 0: tp 1, predicted 2, gold 2 -> 2*1/(2+2) = 0.5
    # class 1: tp 1, predicted 1, gold 2 -> 2*1/(1+2) = 2/3
    # class 2: tp 0 (its row abstained)   -> 0
    expected = (0.5 + 2 / 3 + 0.0) / 3
    assert macro_f1(y_true, y_pred, 3) == pytest.approx(expected)
    assert per_class_f1(y_true, y_pred, 3) == pytest.approx([0.5, 2 / 3, 0.0])
    # a class absent from gold and predictions does not dilute the mean
    assert macro_f1(y_true, y_pred, 5) == pytest.approx(expected)
    # dropping the abstaining rows would score higher: abstaining must not pay
    kept = y_pred != A
    assert macro_f1(y_true[kept], y_pred[kept], 3) > expected
    assert accuracy(y_true, y_pred) == pytest.approx(2 / 5)


def test_macro_f1_includes_classes_only_predicted():
    # gold has only class 0; predicting class 1 once adds class 1 with F1 0 to the mean
    assert macro_f1(np.array([0, 0]), np.array([0, 1]), 2) == pytest.approx((2 / 3 + 0.0) / 2)
    assert macro_f1(np.array([], dtype=int), np.array([], dtype=int), 2) == 0.0


def test_score_annotator_hand_computed():
    votes = np.array([0, 0, A, 1, 0, A])
    y = np.array([0, 1, 0, 1, 0, 2])
    s = score_annotator("a1", votes, y, faults=2)
    assert (s.annotator_id, s.fires, s.correct, s.label, s.faults) == ("a1", 4, 3, 0, 2)
    assert s.precision == pytest.approx(0.75)
    assert s.coverage == pytest.approx(4 / 6)


def test_score_annotator_silent_and_tied():
    silent = score_annotator("s", np.array([A, A]), np.array([0, 1]))
    assert (silent.fires, silent.precision, silent.coverage, silent.label) == (0, 0.0, 0.0, A)
    tied = score_annotator("t", np.array([1, 0, A]), np.array([1, 1, 1]))
    assert tied.label == 0 and tied.precision == pytest.approx(0.5)


def test_pool_macro_f1_is_majority_vote_f1():
    votes = np.array([[0, 0], [1, 0], [A, 1], [A, A]])
    y = np.array([0, 1, 1, 0])
    # MV: [0, 0 (tie), 1, abstain]; class 0: tp 1, pred 2, gold 2 -> 0.5; class 1: tp 1, pred 1, gold 2 -> 2/3
    assert pool_macro_f1(votes, y, 2) == pytest.approx((0.5 + 2 / 3) / 2)
    assert pool_macro_f1(np.zeros((4, 0), dtype=int), y, 2) == 0.0  # an empty pool abstains everywhere


def test_overlap_conflict_coverage_disagreement():
    votes = np.array([[0, 0], [0, 1], [A, 1], [A, A]])
    overlap = overlap_matrix(votes)
    assert overlap == pytest.approx(np.array([[0.5, 0.5], [0.5, 0.75]]))
    conflict = conflict_matrix(votes)
    assert conflict == pytest.approx(np.array([[0.0, 0.25], [0.25, 0.0]]))
    assert coverage_per_class(votes, 3) == pytest.approx([0.5, 0.5, 0.0])
    assert disagreement(votes) == pytest.approx([0.0, 1.0, 0.0, 0.0])
    # three distinct classes, one vote each: log2(3) bits
    assert disagreement(np.array([[0, 1, 2]])) == pytest.approx([np.log2(3)])


def test_marginal_contributions_hand_computed():
    y = np.array([0, 1, 1])
    votes = np.array([[0, 1], [1, 0], [1, A]])  # column 0 is perfect, column 1 always wrong
    # pool MV: [0 (tie), 0 (tie), 1] -> class 0 F1 2/3, class 1 F1 2/3 -> 2/3
    # without column 0: [1, 0, abstain] -> 0 ; without column 1: perfect -> 1
    assert marginal_contributions(votes, y, 2) == pytest.approx([2 / 3, 2 / 3 - 1.0])


def test_audit_and_fitness_are_compared_on_the_classes_the_audit_rows_hold():
    # three classes; the audit rows hold none of class 2, which the pool never gets right
    fitness_gold = np.array([0, 0, 1, 1, 2, 2])
    fitness_votes = np.array([[0], [0], [1], [0], [ABSTAIN], [1]])
    audit_gold = np.array([0, 1, 1, 0])
    audit_votes = np.array([[0], [1], [0], [0]])
    audit, fitness, judged = audit_and_fitness_f1(audit_votes, audit_gold, fitness_votes, fitness_gold, 3)
    assert judged.tolist() == [True, True, False]
    assert audit == pytest.approx(pool_macro_f1(audit_votes, audit_gold, 3))  # the audit figure as before
    per_class = per_class_f1(fitness_gold, majority_vote(fitness_votes, 3), 3)
    assert per_class[2] == 0.0
    assert fitness == pytest.approx(per_class[:2].mean())
    # over every class present the fitness figure counts class 2's zero, which the audit figure cannot see
    everything = pool_macro_f1(fitness_votes, fitness_gold, 3)
    assert everything == pytest.approx(per_class.mean()) and everything < fitness
    # the pool naming class 2 on an audit row does not bring class 2 in: it could only score 0 on rows holding none
    named = np.array([[0], [2], [1], [0]])
    audit, _, judged = audit_and_fitness_f1(named, audit_gold, fitness_votes, fitness_gold, 3)
    assert judged.tolist() == [True, True, False]
    assert audit == pytest.approx(per_class_f1(audit_gold, majority_vote(named, 3), 3)[:2].mean())
