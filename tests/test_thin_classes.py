"""The studio warns when an annotator votes for a class with too few dev rows to judge it on."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.domain import ABSTAIN, FITNESS
from engine.expert.review import thin_classes
from engine.ingest.importer import IngestOptions, import_frame


def test_thin_classes_names_the_voted_classes_with_few_fitness_rows(store):
    labels = ["common"] * 30 + ["rare"] * 4 + ["unvoted"] * 3
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(len(labels))], "text": [f"row {i}" for i in range(len(labels))],
                          "label": labels, "split": "dev"})
    import_frame(store, frame, IngestOptions(audit_fraction=0.0), dataset="t", source="test")
    y = store.gold(FITNESS)
    k = {name: i for i, name in enumerate(store.load_task().labels)}
    votes = np.full(len(y), ABSTAIN)
    votes[:3] = k["rare"]
    votes[3:6] = k["common"]
    assert thin_classes(store, votes) == [("rare", 4)]
    assert thin_classes(store, votes, min_rows=31) == [("common", 30), ("rare", 4)]
    assert thin_classes(store, np.full(len(y), ABSTAIN)) == []
    # every thin class, voted or not, for the evolve and analytics screens' note
    assert sorted(thin_classes(store)) == [("rare", 4), ("unvoted", 3)]


def test_the_plain_words_verdict_says_a_class_is_too_thin_and_what_to_do():
    from engine.domain import AnnotatorScore
    from engine.expert.explain import explain

    score = AnnotatorScore("a", fires=4, coverage=0.1, precision=0.75, label=1, correct=3)
    thin = explain("accept", ["viable: ..."], score, "rare", 40, 0.1, class_rows=4).text()
    assert "Only 4 dev rows the gate judges on are rare" in thin and "by up to 25%" in thin
    assert "Label more rare rows" in thin and "describe rare in its own words (Project screen" in thin
    plenty = explain("accept", ["viable: ..."], score, "rare", 40, 0.1, class_rows=40).text()
    assert "Only" not in plenty
