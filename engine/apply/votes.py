"""Votes in the store: every annotator that has none on a split yet is run (compiled or sandboxed) and saved; and
the annotators' scores recomputed on the fitness rows as they now stand."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from engine.domain import FITNESS
from engine.events import EventKind, EventSink, quiet
from engine.metrics.score import score_annotator
from engine.sandbox.executor import Executor
from engine.store.workspace import Store


def frame_inputs(frame: pd.DataFrame) -> list[dict]:
    """What an annotator reads of each row of `store.examples_frame(...)`: its fields and its text."""
    return [{**f, "text": t} for f, t in zip(frame["fields"].tolist(), frame["text"].tolist(), strict=True)]


def ensure_votes(store: Store, executor: Executor, annotator_ids: list[str], split: str,
                 on_event: EventSink = quiet) -> None:
    """Run the sandbox for every annotator that has no stored votes on `split` yet."""
    missing = [a for a in store.annotators(annotator_ids) if split not in store.voted_splits(a.id)]
    if not missing:
        return
    task = store.load_task()
    frame = store.examples_frame(split)
    inputs = frame_inputs(frame)
    on_event(EventKind.EXECUTING, {"split": split, "annotators": len(missing), "examples": len(inputs)})

    def progress(done: int, total: int) -> None:
        on_event(EventKind.EXECUTE_PROGRESS, {"split": split, "done": done, "total": total})

    results = executor.run(missing, inputs, list(task.labels), on_progress=progress)
    ids = frame["id"].tolist()  # once: a list per annotator cost 0.2 s each at 100K rows
    for annotator, result in zip(missing, results, strict=False):
        store.save_votes(annotator.id, split, ids, result.votes, result.faults, result.first_error, result.seconds)
    # rows that joined the split while the sandbox ran (the expert labels pool rows into dev from the studio): the
    # runs just saved left them abstaining and are recorded as done, so vote on them now, and on any joining meanwhile
    done = set(ids)
    while joined := sorted(set(store.example_ids(split)) - done):
        late = store.examples_frame(split, ids=joined)
        for annotator, result in zip(missing, executor.run(missing, frame_inputs(late), list(task.labels)),
                                     strict=True):
            store.add_votes(annotator.id, late["id"].tolist(), result.votes)
        done.update(joined)


def rescore_on_fitness(store: Store, annotators: Sequence[str]) -> None:
    """Each annotator's stored score recomputed on the fitness rows as they now stand (its dev votes already
    cover them)."""
    gold = store.gold(FITNESS)
    votes = store.vote_matrix(list(annotators), FITNESS).votes
    for j, annotator_id in enumerate(annotators):
        faults = store.voted_splits(annotator_id)["dev"]["faults"]
        store.save_score(score_annotator(annotator_id, votes[:, j], gold, faults=faults))
