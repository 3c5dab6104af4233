"""The honest estimate and its interval (engine/metrics/estimate.py), on hand-built predictions."""
import numpy as np
import pytest

from engine.domain import Estimate
from engine.metrics.estimate import THIN_CLASS_ROWS, estimate_macro_f1, paired_wins
from engine.metrics.score import macro_f1


def noisy(y: np.ndarray, k: int, accuracy: float, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(len(y)) < accuracy, y, rng.integers(0, k, len(y)))


def test_the_point_estimate_is_the_macro_f1_of_the_rows_and_the_interval_holds_it():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 300)
    pred = noisy(y, 4, 0.7, rng)
    est = estimate_macro_f1(y, pred, 4, "dev", seed=0)
    assert est.macro_f1 == pytest.approx(macro_f1(y, pred, 4), abs=1e-4)
    assert est.low < est.macro_f1 < est.high
    assert est.n_rows == 300 and est.judged_on == "dev" and not est.thin and not est.unjudged


def test_a_perfect_score_on_few_rows_still_has_a_lower_bound_below_one():
    y = np.array([0] * 80 + [1] * 12)
    est = estimate_macro_f1(y, y, 2, "audit")
    assert est.macro_f1 == 1.0 and est.high == 1.0
    assert 0.85 < est.low < 0.99  # a bootstrap of rows would say [1, 1]


def test_fewer_rows_give_a_wider_interval():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 1000)
    pred = noisy(y, 5, 0.6, rng)
    wide = estimate_macro_f1(y[:100], pred[:100], 5, "dev")
    narrow = estimate_macro_f1(y, pred, 5, "dev")
    assert (wide.high - wide.low) > 2 * (narrow.high - narrow.low)


def test_thin_and_unjudged_classes_are_named_and_widen_the_interval():
    rng = np.random.default_rng(2)
    y = np.concatenate([rng.integers(0, 3, 300), [3, 3]])  # class 3: two rows; class 4: none
    pred = noisy(y, 5, 0.8, rng)
    est = estimate_macro_f1(y, pred, 5, "dev")
    assert est.thin == (3,) and est.unjudged == (4,) and THIN_CLASS_ROWS > 2
    solid = estimate_macro_f1(y[:300], pred[:300], 3, "dev")
    assert (est.high - est.low) > (solid.high - solid.low)
    assert "too few rows to judge" in est.sentence(("a", "b", "c", "d", "e"))
    assert "d, e have" in est.sentence(("a", "b", "c", "d", "e"))


def test_the_interval_holds_the_figure_of_new_rows_about_as_often_as_it_says():
    rng = np.random.default_rng(3)
    held = 0
    for trial in range(60):
        def draw(n):
            y = rng.integers(0, 6, n)
            return y, noisy(y, 6, 0.75, rng)
        y, pred = draw(300)
        est = estimate_macro_f1(y, pred, 6, "dev", seed=trial, draws=400)
        y_new, pred_new = draw(2000)
        held += est.low <= macro_f1(y_new, pred_new, 6) <= est.high
    assert 0.8 <= held / 60 <= 1.0


def test_no_rows_no_estimate_and_the_dict_round_trips():
    assert estimate_macro_f1(np.array([], dtype=int), np.array([], dtype=int), 3, "dev") is None
    est = estimate_macro_f1(np.array([0, 1, 1, 2] * 10), np.array([0, 1, 2, 2] * 10), 3, "dev", seed=4)
    assert Estimate.from_dict(est.to_dict()) == est
    assert est.to_dict()["interval"] == [est.low, est.high]


def test_paired_wins_says_how_often_one_beats_the_other_on_the_same_rows():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 400)
    good, poor = noisy(y, 3, 0.9, rng), noisy(y, 3, 0.5, rng)
    assert paired_wins(y, good, poor, 3) == 1.0
    assert paired_wins(y, poor, good, 3) == 0.0
    assert paired_wins(y, good, good, 3) == 0.0  # a tie is no win


def test_the_learning_curve_gain_reads_how_much_more_rows_help():
    from engine.aggregators.learning_curve import learning_curve_gain

    rng = np.random.default_rng(6)
    k, per_class = 10, 20
    y = np.repeat(np.arange(k), per_class)
    signal = rng.normal(0, 1.0, (k, 50))  # one direction a class in 50 noisy dimensions: more rows find it better
    learnable = signal[y] * 0.3 + rng.normal(0, 1.0, (len(y), 50))
    noise = rng.normal(0, 1.0, (len(y), 50))  # nothing to learn at any size
    assert learning_curve_gain(y, learnable, k) > 0.01
    assert learning_curve_gain(y, noise, k) < learning_curve_gain(y, learnable, k)
    assert learning_curve_gain(np.array([0, 1]), np.zeros((2, 3)), 2) == 0.0  # too few rows for two folds
    shifted = estimate_macro_f1(np.array([0, 1] * 20), np.array([0, 1] * 20), 2, "dev").shifted(0.05)
    assert shifted.macro_f1 == 1.0 and shifted.gain == 0.05  # capped at 1, the gain recorded
