"""The expert's hand on the pool: approve, reject (disable), restore, and edit-and-rescore.

Every action is an engine call that leaves a logged human verdict with a reason; later generations
respect it (the gate never prunes a human-approved annotator nor re-admits a human-rejected one).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.apply.votes import ensure_votes, frame_inputs
from engine.domain import (
    ABSTAIN,
    FITNESS,
    REPLACED_BY,
    THIN_FITNESS_ROWS,
    Annotator,
    AnnotatorScore,
    Candidate,
    GateDecision,
    restored_by_undo,
)
from engine.evolve import build_context, current_dev_macro_f1, next_generation_config, pool_evidence
from engine.expert.explain import Explanation, explain
from engine.gate import GateConfig, run_gate
from engine.markdown import escape_md
from engine.metrics.score import chance_precision, pool_macro_f1, score_annotator
from engine.sandbox.annotators import make_annotator
from engine.sandbox.checks import CodeRejected
from engine.sandbox.executor import Executor
from engine.store.workspace import Store


@dataclass(frozen=True)
class EditPreview:
    """An edited annotator measured on dev beside the version it came from."""

    annotator: Annotator | None  # None when the code failed its checks
    error: str | None  # why the code was refused, or the first runtime fault
    score: AnnotatorScore | None
    parent_score: AnnotatorScore | None
    contribution: float | None  # pool dev macro-F1 with the new version minus without it
    parent_contribution: float | None
    fired_rows: pd.DataFrame  # dev rows it fires on: id, text, label, vote, correct (wrong first)
    votes: np.ndarray | None = None  # its votes on the fitness rows (what the gate judges)


def approve(store: Store, annotator_id: str, note: str) -> None:
    """Put an annotator in the pool (or restore a disabled one), against the gate if need be."""
    store.record_human_verdict(annotator_id, "approve", note)


def reject(store: Store, annotator_id: str, note: str) -> None:
    """Take an annotator out of the pool (disable); `approve` undoes it."""
    store.record_human_verdict(annotator_id, "reject", note)


# the notes of the two retirements that keep one version of an edited annotator in the pool, then the other's id:
# `save_edit` retires the parent for its edit; an undo that restores a version retires the one it was retired for
RESTORED_OVER = "retired for the version it replaced, restored by an undo: "


def undo(store: Store, annotator_id: str, note: str = "", expected: int | None = None) -> str:
    """Undo the expert's latest verdict on an annotator: the one it overrode stands again (the gate's, which the
    gate may then revise as before, or the expert's earlier one); returns that verdict. Not the opposite verdict,
    which would lock the annotator as the expert's. An annotator and its edit never vote side by side: undoing the
    retirement of a version an edit replaced restores it in place of the edit in the pool (the latest of a chain of
    edits), and undoing that restores the edit in its place again (`displaced_by_undo` names the one that leaves)."""
    def retire() -> tuple[str, str] | None:  # asked inside the undo's transaction: one write, both verdicts
        leaving = displaced_by_undo(store, annotator_id)
        return None if leaving is None else (leaving[0], f"{leaving[1]}{annotator_id}")

    return store.withdraw_human_verdict(annotator_id, note, expected, retire=retire)


def gate_decided_in(store: Store, last: pd.Series) -> int | None:
    """The generation whose pool the reasons of an annotator's latest verdict row `last` were weighed against when
    that pool has changed since: its own for the gate's, the verdict in force's for one an undo restored (its reasons
    are copied from it). None for an expert's verdict, and when no verdict was given after that generation's gate
    (its pool is today's: nothing to date)."""
    if last["decided_by"] == "human":
        return None
    generation = int(last["generation"])
    if restored_by_undo(last["reasons"]):
        in_force = store.verdict_states(str(last["annotator_id"]))
        if not in_force:
            return None
        generation = int(in_force[-1]["generation"])
    return generation if store.verdicts_version() > store.last_gate_verdict(generation) else None


def displaced_by_undo(store: Store, annotator_id: str) -> tuple[str, str] | None:
    """(the pool member an undo of the expert's latest verdict on `annotator_id` would take out, the note its
    retirement gets, before `annotator_id`'s id), or None. Its latest verdict retired it for an edit: that edit, or
    the edit of that edit if the first was edited again, whichever is in the pool now. Or it retired an edit when the
    version before it was restored: that version, if in the pool."""
    states = store.verdict_states(annotator_id)
    said = str(states[-1]["note"]) if states else ""
    pool = set(store.pool_ids())
    edit, seen = _after(said, REPLACED_BY), set()
    while edit is not None and edit not in seen:
        if edit in pool:
            return edit, RESTORED_OVER
        seen.add(edit)
        later = store.verdict_states(edit)
        edit = _after(str(later[-1]["note"]), REPLACED_BY) if later else None
    restored = _after(said, RESTORED_OVER)
    return (restored, REPLACED_BY) if restored in pool else None


def replaced_by(note: str) -> str | None:
    """The edited version a retirement's note names (the version it replaced), else None."""
    return _after(note, REPLACED_BY)


def _after(note: str, prefix: str) -> str | None:
    """The id a retirement's note names after `prefix`, else None."""
    return (note[len(prefix):].strip() or None) if note.startswith(prefix) else None


def _contribution(store: Store, votes: np.ndarray, exclude: str | None) -> float:
    """Pool dev macro-F1 with `votes` added, minus without; `exclude` (the parent) is left out of both."""
    task = store.load_task()
    y = store.gold(FITNESS)
    others = [a for a in store.pool_ids() if a != exclude]
    base = store.vote_matrix(others, FITNESS).votes
    with_it = np.column_stack([base, votes]) if base.size else votes[:, None]
    return pool_macro_f1(with_it, y, len(task.labels)) - pool_macro_f1(base, y, len(task.labels))


def fired_rows(store: Store, votes: np.ndarray) -> pd.DataFrame:
    """The fitness rows (dev minus audit) an annotator fires on, wrong votes first.

    `label` names the gold class (every class of a multi-label row, comma separated); a vote is correct
    when its class is among them.
    """
    task = store.load_task()
    frame = store.examples_frame(FITNESS)
    gold = store.label_matrix(FITNESS)
    mask = votes != ABSTAIN
    rows = np.flatnonzero(mask)
    out = pd.DataFrame({"id": frame["id"][mask], "text": frame["text"][mask],
                        "label": [", ".join(task.labels[c] for c in np.flatnonzero(gold[i])) for i in rows],
                        "vote": [task.labels[int(v)] for v in votes[mask]]})
    out["correct"] = gold[rows, votes[mask].astype(int)] == 1
    return out.sort_values("correct", kind="stable").reset_index(drop=True)


def preview_edit(store: Store, executor: Executor, source: str, parent_id: str | None = None,
                 name: str = "") -> EditPreview:
    """Check and run edited code on dev in the sandbox without saving anything (`name`: else the parent's)."""
    parent = store.annotator(parent_id) if parent_id else None
    parent_score = store.scores([parent_id]).get(parent_id) if parent_id else None
    parent_contribution = None
    if parent is not None:
        ensure_votes(store, executor, [parent.id], "dev")
        parent_votes = store.vote_matrix([parent.id], FITNESS).votes[:, 0]
        parent_contribution = _contribution(store, parent_votes, exclude=parent.id)
    empty = pd.DataFrame(columns=["id", "text", "label", "vote", "correct"])
    try:
        annotator = make_annotator(Candidate(source, "human", name or (parent.name if parent else ""),
                                             (parent.id,) if parent else ()), store.last_complete_generation(),
                                   author="human")
    except CodeRejected as err:
        return EditPreview(None, err.reason, None, parent_score, None, parent_contribution, empty)
    task = store.load_task()
    frame = store.examples_frame(FITNESS)
    inputs = frame_inputs(frame)
    result = executor.run([annotator], inputs, list(task.labels))[0]
    score = score_annotator(annotator.id, result.votes, store.gold(FITNESS), faults=result.faults)
    contribution = _contribution(store, result.votes, exclude=parent.id if parent else None)
    return EditPreview(annotator, result.first_error, score, parent_score, contribution, parent_contribution,
                       fired_rows(store, result.votes), result.votes)


def save_edit(store: Store, executor: Executor, source: str, parent_id: str | None, note: str,
              name: str = "", gate: Sequence[GateDecision] = ()) -> Annotator:
    """Save edited code as a new human-authored version, approve it, and retire its parent. With `gate` (the gate's
    accept of it, and the prunes that come with it: `submit`), the gate's verdicts are recorded instead of the
    expert's approval: accepted by the gate, it is not locked in, and later gates weigh it as any member.

    Raises CodeRejected when the code fails its checks; nothing is saved then.
    """
    parent = store.annotator(parent_id) if parent_id else None
    annotator = make_annotator(Candidate(source, "human", name or (parent.name if parent else ""),
                                         (parent.id,) if parent else ()), store.last_complete_generation(),
                               author="human")
    annotator = dataclasses.replace(annotator, written_by="person")
    if annotator.id == parent_id:
        raise CodeRejected("the edited code is the same as the original (after normalising)")
    store.save_annotator(annotator)
    ensure_votes(store, executor, [annotator.id], "dev")
    run = store.voted_splits(annotator.id)["dev"]
    votes = store.vote_matrix([annotator.id], FITNESS).votes[:, 0]
    store.save_score(score_annotator(annotator.id, votes, store.gold(FITNESS), faults=run["faults"]))
    # one write, as an undo's restore is: a generation reading between two saw the version and its edit side by side
    with store.transaction():
        if gate:
            store.record_gate_decisions(gate)
        else:
            approve(store, annotator.id, note or "edited by hand")
        if parent is not None and parent.id in store.pool_ids():
            reject(store, parent.id, f"{REPLACED_BY}{annotator.id}")
    return annotator


def explain_verdicts(store: Store, verdicts: pd.DataFrame) -> dict[int, Explanation]:
    """Each verdict row (annotator_id, verdict, reasons, decided_by) in plain words, keyed by the row's index:
    its fires and precision on the fitness rows, chance for its classes there, and the deciding check."""
    if verdicts.empty:
        return {}
    task = store.load_task()
    ids = list(dict.fromkeys(verdicts["annotator_id"]))
    votes = store.vote_matrix(ids, FITNESS).votes
    y = store.gold(FITNESS)
    # names and labels come from data, LLMs and people; the explanation is markdown (`escape_md`)
    names = {a.id: escape_md(a.name or a.id[:8]) for a in store.annotators()}
    column = {a: votes[:, j] for j, a in enumerate(ids)}
    scores = {a: score_annotator(a, column[a], y) for a in ids}
    chance = {a: chance_precision(column[a], y, len(task.labels)) for a in ids}
    rows_of = class_rows(store)
    out = {}
    for index, row in verdicts.iterrows():
        a = row["annotator_id"]
        s = scores[a] if scores[a].fires else store.scores([a]).get(a)
        label = task.labels[s.label] if s is not None and s.label != ABSTAIN else ""
        out[index] = explain(row["verdict"], list(row["reasons"]), s, escape_md(label), len(y), chance[a],
                             row["decided_by"], names, rows_of.get(label), str(row.get("note") or ""))
    return out


def idle_generations(generations: pd.DataFrame) -> int:
    """How many of the last complete generations in a row drew no candidate at all (`store.generations()`): the
    agents found nothing new their preview of the gate expects to pass on these dev rows, so more generations alone
    will not grow the pool (SemEval's 178 dev rows: nothing after the first)."""
    done = generations[generations["status"] == "complete"].sort_values("number")
    idle = 0
    for proposed in reversed(done["n_candidates"].tolist()):
        if proposed:
            break
        idle += 1
    return idle


IDLE_ADVICE = ("more generations alone will not grow the pool. What can: label more dev rows (most of all of the "
               "classes with few), describe the labels (their words become cues), write an annotator yourself "
               "(Annotator screen: Write a new annotator; or `evopool pool add`), or let LLM agents propose")


def class_rows(store: Store) -> dict[str, int]:
    """Fitness rows (the dev rows the gate judges on) of each class, in label order."""
    task = store.load_task()
    gold = store.gold(FITNESS)
    per_class = gold.sum(axis=0) if gold.ndim == 2 else np.bincount(gold[gold >= 0], minlength=len(task.labels))
    return {label: int(per_class[c]) for c, label in enumerate(task.labels)}


def thin_classes(store: Store, votes: np.ndarray | None = None,
                 min_rows: int = THIN_FITNESS_ROWS) -> list[tuple[str, int]]:
    """(label, fitness rows) of each class (only those `votes` vote for, when given) with fewer than `min_rows`
    dev rows the gate judges on: with 2-10 rows, one lucky or unlucky row moves its precision by 0.1-0.5, and
    each such class weighs as much in macro-F1 as the biggest one. The studio says so, and what the expert can do."""
    rows = class_rows(store)
    labels = list(rows)
    voted = (range(len(labels)) if votes is None else
             sorted({int(v) for v in np.asarray(votes).ravel() if v != ABSTAIN}))
    return [(labels[c], rows[labels[c]]) for c in voted if rows[labels[c]] < min_rows]

def submit(store: Store, executor: Executor, source: str, name: str = "", approve_anyway: bool = False,
           gate: GateConfig | None = None, via: str = "evopool pool add") -> dict:
    """`evopool pool add`: check, run on the fitness rows in the sandbox, score, ask the gate for its verdict on
    this one candidate against the pool (with the pool-sample evidence a generation would weigh), and save it as the
    editor saves when the gate accepts or the expert overrides a rejection (`approve_anyway`); else nothing is
    saved."""
    preview = preview_edit(store, executor, source, name=name)
    if preview.annotator is None or preview.score is None or preview.votes is None:
        return {"added": False, "verdict": "refused", "reasons": [preview.error], "id": None, "name": name}
    annotator, score = preview.annotator, preview.score
    if annotator.id in store.pool_ids():  # the same code: judged as a newcomer it "joined" and got locked
        member = store.annotator(annotator.id)
        return {"added": False, "verdict": "in pool", "id": annotator.id, "name": member.name if member else name,
                "reasons": [f"already in the pool as {member.name if member else annotator.id}: nothing to add"],
                "pool_size": len(store.pool_ids())}
    task = store.load_task()
    pool_ids = store.pool_ids()
    ensure_votes(store, executor, pool_ids, "dev")
    # the pool-sample evidence a generation weighs for every candidate (the sample the next one would draw), so
    # `pool add` and a generation give one annotator the same verdict
    context = build_context(store, store.last_complete_generation() + 1, next_generation_config(store))
    evidence = pool_evidence(executor, context, [annotator])
    outcome = run_gate(pool_ids, store.vote_matrix(pool_ids, FITNESS).votes, store.scores(pool_ids),
                       [(annotator, preview.votes, score)], store.gold(FITNESS), len(task.labels), gate or GateConfig(),
                       store.human_locked(), evidence)
    decision = next(d for d in outcome.decisions if d.annotator_id == annotator.id)
    accepted = decision.verdict in ("accept", "approve")
    added = accepted or approve_anyway
    pruned: list[str] = []
    if accepted:
        # the gate's verdict, not the expert's approval (which would lock it in), and the members it
        # replaces (judged with them gone) leave in the same write
        members = set(store.pool_ids())
        prunes = [d for d in outcome.decisions if d.verdict == "prune" and d.annotator_id in members]
        # each row says where it came from: no generation's gate gave it
        said = f"{via}: the gate accepted it"
        save_edit(store, executor, source, None, said, name=name,
                  gate=[dataclasses.replace(decision, note=said),
                        *(dataclasses.replace(d, note=f"{via}: the gate's newcomer replaces it") for d in prunes)])
        pruned = [d.annotator_id for d in prunes]
    elif approve_anyway:
        save_edit(store, executor, source, None,
                  f"{via}, added over the gate's rejection: " + "; ".join(decision.reasons), name=name)
    return {"added": added, "verdict": decision.verdict, "reasons": list(decision.reasons),
            "approved_over_gate": added and not accepted, "id": annotator.id, "name": annotator.name,
            "precision": round(score.precision, 4), "coverage": round(score.coverage, 4), "fires": score.fires,
            "faults": score.faults, "first_error": preview.error,
            "contribution": None if preview.contribution is None else round(preview.contribution, 4),
            "pruned": pruned,
            "pool_size": len(store.pool_ids()),
            # the pool's dev macro-F1 as the gate weighed it (with the candidate, without what it prunes), or as the
            # pool stands now when the expert added it over the gate (or nothing joined)
            "dev_macro_f1": round(outcome.f1_after if accepted else current_dev_macro_f1(store), 4)}
