"""One generation = propose -> check -> execute (sandbox) -> score -> gate, persisted as it goes.

Candidates, their dev votes and scores are written as they are produced (the studio shows them
arriving); the gate's verdicts and the generation's `complete` mark are written in one transaction.
A killed run therefore leaves at most a `running` generation, which the next run redoes. A generation whose
agents proposed nothing because the LLM budget ran out is recorded as `starved` (not complete) and ends the
run; the next run with budget left redoes it.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from engine.agents.base import ExpertFeedback, ProposalContext, Proposer
from engine.apply.votes import ensure_votes, rescore_on_fitness
from engine.domain import AGENT_ROLES, AUDIT, FIRST_FAULT, FITNESS, Annotator, Estimate, Generation
from engine.events import EventKind, EventSink, RunStopped, quiet
from engine.gate import GateConfig, GateOutcome, run_gate
from engine.metrics.estimate import estimate_macro_f1
from engine.metrics.score import majority_vote, pool_macro_f1, score_annotator
from engine.pseudo_labels import pseudo_label
from engine.sandbox.annotators import make_annotator
from engine.sandbox.checks import CodeRejected
from engine.sandbox.executor import Executor
from engine.store.workspace import Store


@dataclass(frozen=True)
class EvolveConfig:
    gate: GateConfig = field(default_factory=GateConfig)
    roles: tuple[str, ...] = AGENT_ROLES
    pool_sample_size: int = 4000  # unlabeled rows an agent may read for word statistics
    seed: int = 0
    pseudo_labels: bool = True  # guess the pool sample with a dev-fitted text classifier (engine/pseudo_labels.py)


def build_context(store: Store, generation: int, config: EvolveConfig,
                  fitness: tuple[list[str], np.ndarray] | None = None) -> ProposalContext:
    """What the agents may see: task, dev (labeled), a seeded pool sample (unlabeled), the pool's state. `fitness`:
    the generation's fitness rows and their gold (`fitness_rows`; read here when not given). The rows, their votes
    and their label sets are read for those ids, so rows the expert labels into dev meanwhile (while the pseudo-
    labeler fits) cannot make the votes belong to other rows than the examples."""
    task = store.load_task()
    ids, gold = fitness if fitness is not None else fitness_rows(store)
    dev = tuple(store.examples(FITNESS, ids))  # never the audit rows
    rng = np.random.default_rng(config.seed * 1_000_003 + generation)
    pool_ids_all = store.example_ids("pool")
    take = min(config.pool_sample_size, len(pool_ids_all))
    sample_ids = sorted(rng.choice(len(pool_ids_all), size=take, replace=False)) if take else []
    pool_sample = tuple(store.examples("pool", [pool_ids_all[i] for i in sample_ids]))
    pool_ids = store.pool_ids()
    excluded = frozenset(a for a, v in store.human_locked().items() if v == "reject")
    pseudo = pseudo_label(store, dev, pool_sample, config.seed) if config.pseudo_labels else None
    return ProposalContext(
        task=task, dev=dev, pool_sample=pool_sample, annotators=tuple(store.annotators(pool_ids)),
        scores=store.scores(pool_ids), dev_votes=store.vote_matrix(pool_ids, FITNESS, example_ids=ids).votes,
        generation=generation, seed=config.seed, excluded_ids=excluded,
        dev_label_sets=gold if task.multi_label else None,
        feedback=expert_feedback(store), pseudo=pseudo,
    )


def expert_feedback(store: Store, limit: int = 20) -> ExpertFeedback:
    """The expert's latest verdict on each annotator they judged (with the reason typed), their edits, and the
    group of unlabeled rows they aimed the next generation at (the workspace's `focus`)."""
    verdicts = store.verdicts()
    # each annotator's latest verdict, if the expert's: one the expert undid is no longer their judgement
    latest = verdicts.groupby("annotator_id").tail(1)
    human = latest[latest["decided_by"] == "human"]
    judged = {row.annotator_id: (row.verdict, row.note or "") for row in human.itertuples()}
    by_id = {a.id: a for a in store.annotators(list(judged))} if judged else {}
    edits = []
    for child in (a for a in by_id.values() if a.author == "human" and a.parent_ids):
        parent = store.annotator(child.parent_ids[0])
        if parent is not None:
            edits.append((parent, child, judged.get(child.id, ("", ""))[1]))
    replaced = {parent.id for parent, _, _ in edits}  # an edited annotator's old version is not a rejected idea
    rejected = tuple((by_id[i], note) for i, (v, note) in judged.items()
                     if v == "reject" and i in by_id and i not in replaced)
    approved = tuple((by_id[i], note) for i, (v, note) in judged.items()
                     if v == "approve" and i in by_id and by_id[i].author != "human")
    focus = store.get_meta("focus") or {}
    split = "pool" if focus.get("split") == "pool" else FITNESS  # never an audit or test row
    examples = tuple(store.examples(split, focus["example_ids"])) if focus.get("example_ids") else ()
    examples = tuple(replace(ex, label=None) for ex in examples)  # aimed rows never carry a label to the agents
    # every rejection: the agents never propose a rejected idea again, in any wording (`agents.feedback`); a
    # prompt quotes only the last few of each kind (`prompts.expert_feedback_text`)
    return ExpertFeedback(rejected=rejected, approved=approved[-limit:], edits=tuple(edits[-limit:]),
                          focus_terms=tuple(focus.get("terms", ())), focus_examples=examples)


class BudgetStarved(Exception):
    """The agents proposed nothing in a generation because the LLM budget is spent."""


def empty_reason(proposer: Proposer) -> str:
    """Why a role's proposal came back empty, from what the proposer reports (budget, endpoint, drops)."""
    if getattr(proposer, "budget_exhausted", False):
        return getattr(proposer, "budget_message", "") or "the LLM budget is spent"
    stopped = getattr(proposer, "stopped", None)
    dropped = [reason for _, reason in getattr(proposer, "last_dropped", [])]
    skipped = getattr(proposer, "last_skipped", [])  # members that sent nothing (their endpoint stopped earlier)
    if dropped:
        common = "; ".join(f"{n}x {r[:120]}" for r, n in Counter(dropped).most_common(2))
        return f"all {len(dropped)} drafts were dropped: {common}" + "".join(f"; {s}" for s in skipped)
    if skipped:
        return "; ".join(skipped)
    if stopped:
        return "; ".join(stopped.values())
    return "the agent found nothing new to propose"


def _check_candidates(store: Store, proposer: Proposer, context: ProposalContext, number: int,
                      config: EvolveConfig, on_event: EventSink) -> list[Annotator]:
    """Ask each role for candidates; keep those that pass the code checks and are new."""
    judged = set(store.latest_verdicts())
    seen: set[str] = set()
    fresh: list[Annotator] = []
    n_proposed = 0
    for role in config.roles:
        on_event(EventKind.AGENT_STARTED, {"generation": number, "agent": role})
        proposals = proposer.propose(role, context)
        n_proposed += len(proposals)
        kept = 0
        for candidate in proposals:
            try:
                annotator = make_annotator(candidate, number)
            except CodeRejected as err:
                on_event(EventKind.CANDIDATE_DROPPED, {"agent": role, "name": candidate.name, "reason": err.reason})
                continue
            annotator = dataclasses.replace(annotator, written_by=candidate.written_by or getattr(proposer, "name", ""))
            if annotator.id in seen or annotator.id in judged:
                continue
            seen.add(annotator.id)
            store.save_annotator(annotator)
            fresh.append(annotator)
            kept += 1
            on_event(EventKind.CANDIDATE, {"generation": number, "agent": role, "annotator_id": annotator.id,
                                   "name": annotator.name})
        finished = {"generation": number, "agent": role, "proposed": len(proposals), "kept": kept}
        skipped = getattr(proposer, "last_skipped", None)
        if proposals and skipped:  # the others proposed; a skipped one says so
            finished["skipped"] = "; ".join(skipped)
        if not proposals:
            finished["why"] = empty_reason(proposer)
        on_event(EventKind.AGENT_FINISHED, finished)
    if n_proposed == 0 and getattr(proposer, "budget_exhausted", False):
        raise BudgetStarved(empty_reason(proposer))
    return fresh


def pool_evidence(executor: Executor, context: ProposalContext,
                  fresh: list[Annotator]) -> dict[str, tuple[float, float]] | None:
    """Each candidate's precision evidence on the agents' pool sample, from its votes there and the sample's
    pseudo-labels; the gate pools it with dev's counts (LLM- and expert-written code gets the same check as the
    offline agents' own preview)."""
    if context.pseudo is None or not context.pseudo.trusted or not context.pool_sample:
        return None  # untrusted guesses weigh nothing: no sandbox run over the sample for them
    judged = [a for a in fresh if not a.mined_on_guesses]  # those were chosen to agree with the guesses
    if not judged:
        return None
    inputs = [ex.as_input() for ex in context.pool_sample]
    results = executor.run(judged, inputs, list(context.task.labels))
    return {a.id: context.pseudo.evidence_of_votes(np.asarray(r.votes)) for a, r in zip(judged, results, strict=True)}


EVOLVE_SEED = "evolve_seed"  # meta key: the seed of the workspace's last evolve run


def next_generation_config(store: Store) -> EvolveConfig:
    """The config a next generation of this workspace would run with, as far as the store knows (its seed)."""
    return EvolveConfig(seed=int(store.get_meta(EVOLVE_SEED, 0) or 0))


def fitness_rows(store: Store) -> tuple[list[str], np.ndarray]:
    """The fitness rows' ids and gold labels, read as one state: rows may join dev between two reads (the studio
    labels rows into dev while a generation runs), so read again until the ids before and after agree."""
    while True:
        ids = store.example_ids(FITNESS)
        gold = store.gold(FITNESS)
        if store.example_ids(FITNESS) == ids:
            return ids, gold


def run_generation(store: Store, proposer: Proposer, executor: Executor, number: int,
                   config: EvolveConfig = EvolveConfig(), on_event: EventSink = quiet) -> Generation:
    started = time.monotonic()
    store.start_generation(number)
    on_event(EventKind.GENERATION_STARTED, {"generation": number})
    task = store.load_task()
    n_classes = len(task.labels)
    # the fitness rows stay these for the whole generation: rows the expert labels into dev meanwhile (the Labels
    # screen) join the next one, or the candidates' votes would outnumber these labels
    fitness_ids, y_dev = fitness_rows(store)  # y_dev: (n,) labels, or (n, k) label sets on a multi-label task
    context = build_context(store, number, config, (fitness_ids, y_dev))
    pool_ids = [a.id for a in context.annotators]
    ensure_votes(store, executor, pool_ids, "dev", on_event)
    pool_votes = store.vote_matrix(pool_ids, FITNESS, example_ids=fitness_ids).votes

    try:
        fresh = _check_candidates(store, proposer, context, number, config, on_event)
    except BudgetStarved as starved:
        store.stop_generation(number, "starved", str(starved))
        on_event(EventKind.STOPPED, {"generation": number, "reason": str(starved)})
        raise
    except RunStopped:
        raise  # stopped at once by the expert: not a failure, redone by the next run
    except Exception as err:  # an agent that failed for good (an LLM call after its retries): said, not left running
        store.stop_generation(number, "failed", f"{type(err).__name__}: {err}"[:500])
        raise
    ensure_votes(store, executor, [a.id for a in fresh], "dev", on_event)
    candidate_votes = store.vote_matrix([a.id for a in fresh], FITNESS, example_ids=fitness_ids).votes
    candidates, ran = [], {}  # ran: the rows each one's dev run covered (its faults are over all of dev)
    first_faults: dict[str, str] = {}  # what went wrong first, for a candidate whose run faulted
    for j, annotator in enumerate(fresh):
        run = store.voted_splits(annotator.id)["dev"]
        ran[annotator.id] = int(run["n"])
        if run["faults"] and run["first_error"]:
            first_faults[annotator.id] = str(run["first_error"])
        score = score_annotator(annotator.id, candidate_votes[:, j], y_dev, faults=run["faults"])
        store.save_score(score)
        candidates.append((annotator, candidate_votes[:, j], score))
        on_event(EventKind.SCORED, {"generation": number, "annotator_id": annotator.id, "name": annotator.name,
                            "agent": annotator.agent, "precision": score.precision, "fires": score.fires,
                            "coverage": score.coverage, "faults": score.faults,
                            "first_error": run["first_error"]})

    evidence = pool_evidence(executor, context, fresh)  # a sandbox run: verdicts the expert gives meanwhile count
    # the pool the candidates are judged against is the one the expert has now: a member rejected since the
    # generation began is out; one approved meanwhile (an edit, a restore, `pool add`) or brought back by an undo is
    # in (read from the locks alone, an undone rejection left its member out, and a near copy of it got in beside it).
    # The locks and the pool come from one read, so a verdict given between two reads cannot split them
    latest = store.latest_verdicts()
    locked = {a: verdict for a, (verdict, by) in latest.items() if by == "human"}
    now = {a for a, (verdict, _) in latest.items() if verdict in ("accept", "approve")}
    kept = [j for j, member in enumerate(pool_ids) if member in now]
    known = set(pool_ids) | {c.id for c in fresh}
    joined = sorted(now - known)
    ensure_votes(store, executor, joined, "dev", on_event)
    judged_ids = [pool_ids[j] for j in kept] + joined
    judged_votes = np.column_stack([pool_votes[:, kept],
                                    store.vote_matrix(joined, FITNESS, example_ids=fitness_ids).votes])
    outcome = run_gate(judged_ids, judged_votes, context.scores, candidates, y_dev, n_classes, config.gate, locked,
                       evidence, ran)
    outcome = with_first_faults(outcome, first_faults)
    for decision in outcome.decisions:
        on_event(EventKind.VERDICT, {"generation": number, "annotator_id": decision.annotator_id,
                             "verdict": decision.verdict, "reasons": list(decision.reasons)})
    if store.example_ids(FITNESS) != fitness_ids:  # rows joined dev meanwhile: the stored scores the screens read
        rescore_on_fitness(store, [a.id for a in fresh])  # are on the rows as they are now (the gate's stand above)
    seconds = time.monotonic() - started
    store.complete_generation(number, outcome.decisions, f1_before=outcome.f1_before, f1_after=outcome.f1_after,
                              n_candidates=len(fresh), pool_size=len(outcome.pool_ids),
                              reverted=outcome.reverted, seconds=seconds)
    generation = Generation(number, tuple(outcome.pool_ids), outcome.f1_before, outcome.f1_after,
                            tuple(outcome.decisions), len(fresh), outcome.reverted, seconds)
    on_event(EventKind.GENERATION_COMPLETE, {"generation": number, "pool_size": len(outcome.pool_ids),
                                     "dev_macro_f1": outcome.f1_after, "reverted": outcome.reverted,
                                     "accepted": sum(d.verdict == "accept" for d in outcome.decisions),
                                     "candidates": len(fresh), "seconds": round(seconds, 2)})
    return generation


def with_first_faults(outcome: GateOutcome, first_faults: Mapping[str, str]) -> GateOutcome:
    """A rejected candidate whose run faulted also says its first fault: "fires 0 < 5" hid an annotator that
    returned `'spam'` for the label `SPAM` on every row it meant to vote (a review against a small model)."""
    decisions = tuple(
        dataclasses.replace(d, reasons=(*d.reasons, f"{FIRST_FAULT}{first_faults[d.annotator_id]}"))
        if d.verdict == "reject" and d.annotator_id in first_faults else d for d in outcome.decisions)
    return dataclasses.replace(outcome, decisions=decisions)


def evolve(store: Store, proposer: Proposer, executor: Executor, generations: int,
           config: EvolveConfig = EvolveConfig(), on_event: EventSink = quiet,
           should_stop: Callable[[], bool] = lambda: False) -> list[Generation]:
    """Run until `generations` complete generations exist (so a rerun resumes where a killed run stopped).

    A generation starved by the LLM budget ends the run early (recorded, not complete: see `BudgetStarved`).
    """
    done: list[Generation] = []
    store.set_meta(EVOLVE_SEED, config.seed)  # the pool sample a next generation draws: `evopool pool add` draws it too
    for number in range(store.last_complete_generation() + 1, generations + 1):
        if should_stop():
            on_event(EventKind.STOPPED, {"generation": number})
            break
        try:
            done.append(run_generation(store, proposer, executor, number, config, on_event))
        except BudgetStarved:
            break
    return done


def current_dev_macro_f1(store: Store) -> float:
    """Macro-F1 of the current pool on the fitness rows (majority vote; any-vote sets when multi-label)."""
    ids = store.pool_ids()
    votes = store.vote_matrix(ids, FITNESS).votes
    return pool_macro_f1(votes, store.gold(FITNESS), len(store.load_task().labels))


def pool_audit_estimate(store: Store, number: int | None = None) -> Estimate | None:
    """The pool's majority vote (a row nobody votes on is wrong) on the audit rows the agents and the gate never saw,
    with its interval: what the fitness figure, measured where the gate chose the pool, cannot say. None without
    audit rows or on a multi-label task. `number`: the pool of that generation (default: as it stands)."""
    task = store.load_task()
    if task.multi_label or not store.count_examples(AUDIT):
        return None
    votes = store.vote_matrix(store.pool_ids(number), AUDIT).votes
    k = len(task.labels)
    return estimate_macro_f1(store.gold(AUDIT), majority_vote(votes, k), k, AUDIT)
