"""Where the pool is weak: hand-made votes on two obvious topics, one covered and one not."""
from __future__ import annotations

import numpy as np

from engine.domain import ABSTAIN
from engine.weak_spots import weak_spots

A = ABSTAIN


def test_the_uncovered_topic_ranks_first_with_its_words_and_rows():
    sport = [f"the football match ended with a late goal number {i}" for i in range(40)]
    money = [f"please pay the invoice to the bank account ref {i}" for i in range(40)]
    texts = sport + money
    votes = np.full((80, 2), A)
    votes[:40, 0] = 0  # every sport row voted class 0; the money rows get nothing
    votes[:5, 1] = 1  # five sport rows disputed
    spots, rows = weak_spots(votes, texts, n_classes=2, n_clusters=2, seed=0)
    assert len(rows) == 80 and len(spots) == 2
    first, second = spots
    assert set(first.example_rows) <= set(range(40, 80))
    assert first.no_vote_share == 1.0 and first.top_label == ABSTAIN and first.weak_rows == 40
    assert {"invoice", "bank"} <= set(first.terms)
    assert second.no_vote_share == 0.0 and second.top_label == 0
    assert abs(second.conflict_share - 5 / 40) < 1e-9 and second.weak_rows == 5
    assert set(second.example_rows[:5]) == set(range(5))  # the disputed rows first


def test_no_pool_yet_means_every_row_is_weak():
    texts = [f"word{i % 5} common text here {i}" for i in range(60)]
    spots, _ = weak_spots(np.full((60, 0), A), texts, n_classes=3, n_clusters=3)
    assert spots and all(s.no_vote_share == 1.0 for s in spots)
    assert sum(s.size for s in spots) == 60
