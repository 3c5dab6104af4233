"""Progress event kinds: typed in the engine, plain strings in the workspace, read back the same either way."""
from __future__ import annotations

from engine.events import EventKind
from studio.progress import fold_events


def test_kinds_are_their_stored_strings():
    assert EventKind.GENERATION_COMPLETE == "generation_complete"
    assert EventKind("verdict") is EventKind.VERDICT
    assert len({k.value for k in EventKind}) == len(EventKind)  # no two kinds share a string


def test_a_run_written_as_plain_strings_folds_like_a_typed_one(store):
    """A workspace written before `EventKind` existed (kinds as bare strings) reads the same as a new one."""
    run = [
        ("generation_started", {"generation": 1}),
        ("agent_started", {"generation": 1, "agent": "generator"}),
        ("candidate", {"generation": 1, "agent": "generator", "annotator_id": "a1", "name": "spam_links"}),
        ("scored", {"generation": 1, "annotator_id": "a1", "name": "spam_links", "agent": "generator",
                    "precision": 0.9, "fires": 12, "coverage": 0.1, "faults": 0, "first_error": None}),
        ("verdict", {"generation": 1, "annotator_id": "a1", "verdict": "accept", "reasons": ["precise"]}),
        ("generation_complete", {"generation": 1, "pool_size": 1, "dev_macro_f1": 0.5, "reverted": False,
                                 "accepted": 1, "candidates": 1, "seconds": 0.1}),
        ("stopped", {"generation": 2}),
    ]
    for kind, payload in run:
        store.add_event("old-run", kind, payload)
    for kind, payload in run:
        store.add_event("new-run", EventKind(kind), payload)
    old, new = fold_events(store.events("old-run")), fold_events(store.events("new-run"))
    assert (old.feed, old.candidates, old.finished) == (new.feed, new.candidates, new.finished)
    assert old.feed[0] == "Generation 1 started" and old.feed[-1] == "Stopped."
    assert old.candidates == [{"generation": 1, "agent": "generator", "id": "a1", "name": "spam_links",
                               "precision": 0.9, "coverage": 0.1, "fires": 12, "verdict": "accept",
                               "reasons": "precise"}]
    assert old.finished == "stopped" and old.completed[0]["pool_size"] == 1
