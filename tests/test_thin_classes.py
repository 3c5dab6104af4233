"""The studio warns when an annotator votes for a class with too few dev rows to judge it on."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.domain import ABSTAIN, FITNESS
from engine.ingest.importer import IngestOptions, import_frame
from engine.review import thin_classes


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
