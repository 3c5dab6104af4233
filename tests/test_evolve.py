"""The evolve loop end to end on the bundled demo: real sandbox workers, real DuckDB file, offline agents."""
from __future__ import annotations

import pytest
from demo_ideas import WIDER_CAPS

from engine.agents.offline.proposer import OfflineProposer
from engine.domain import AUDIT, FITNESS, Candidate
from engine.events import EventKind
from engine.evolve import EvolveConfig, current_dev_macro_f1, evolve, run_generation
from engine.expert.review import approve, reject
from engine.ingest.importer import IngestOptions, import_path
from engine.metrics.score import pool_macro_f1
from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store


@pytest.fixture(scope="module")
def executor():
    with SandboxExecutor(workers=2) as ex:
        yield ex


@pytest.fixture
def demo_store(tmp_path, demo_csv) -> Store:
    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv)
    return store


def test_two_generations_build_a_gated_pool(demo_store, executor):
    events = []
    done = evolve(demo_store, OfflineProposer(), executor, 2, on_event=lambda k, p: events.append((k, p)))
    assert [g.number for g in done] == [1, 2]
    pool = demo_store.pool_ids()
    assert pool and demo_store.last_complete_generation() == 2
    # the stored pool's fitness macro-F1 is what the generation reported, recomputed from stored votes
    votes = demo_store.vote_matrix(pool, FITNESS).votes
    assert pool_macro_f1(votes, demo_store.label_indices(FITNESS), 2) == pytest.approx(done[-1].dev_macro_f1_after)
    assert done[-1].dev_macro_f1_after >= done[0].dev_macro_f1_before
    # every candidate got exactly one gate verdict with reasons, and events report it
    verdicts = demo_store.verdicts()
    assert set(verdicts["verdict"]) <= {"accept", "reject", "prune"}
    assert all(len(r) > 0 for r in verdicts["reasons"])
    kinds = [k for k, _ in events]
    assert all(isinstance(k, EventKind) for k in kinds)  # the engine emits typed kinds
    assert kinds.count("generation_complete") == 2 and "candidate" in kinds and "verdict" in kinds
    # each pool member's stored dev score matches its stored votes
    scores = demo_store.scores(pool)
    for j, annotator_id in enumerate(pool):
        fired = votes[:, j] != -1
        assert scores[annotator_id].fires == int(fired.sum())


class _Recorder(OfflineProposer):
    """The offline proposer, noting which labeled rows it was shown."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def propose(self, role, context):
        self.seen.update(ex.id for ex in context.dev)
        return super().propose(role, context)


def test_agents_and_gate_never_see_the_audit_rows(tmp_path, demo_csv, executor):
    demo_store = Store.open(tmp_path / "audited")
    import_path(demo_store, demo_csv, IngestOptions(audit_fraction=0.5))  # the demo's 120 dev rows: 60 audit
    audit = set(demo_store.example_ids(AUDIT))
    fitness = set(demo_store.example_ids(FITNESS))
    assert audit and fitness and not audit & fitness
    assert audit | fitness == set(demo_store.example_ids("dev"))
    recorder = _Recorder()
    evolve(demo_store, recorder, executor, 1)
    assert recorder.seen == fitness
    # annotator scores (what the gate judged) count fires on fitness rows only
    votes = demo_store.vote_matrix(demo_store.pool_ids(), FITNESS).votes
    scores = demo_store.scores(demo_store.pool_ids())
    for j, annotator_id in enumerate(demo_store.pool_ids()):
        assert scores[annotator_id].fires == int((votes[:, j] != -1).sum())
    # the pool still votes on the audit rows, so aggregators can be judged there
    assert (demo_store.vote_matrix(demo_store.pool_ids(), AUDIT).votes != -1).any()


def test_rerun_resumes_after_a_killed_generation(demo_store, executor):
    evolve(demo_store, OfflineProposer(), executor, 1)
    demo_store.start_generation(2)  # a run killed mid-generation 2 leaves it 'running'
    assert demo_store.last_complete_generation() == 1
    done = evolve(demo_store, OfflineProposer(), executor, 2)
    assert [g.number for g in done] == [2]
    assert list(demo_store.generations()["status"]) == ["complete", "complete"]
    assert evolve(demo_store, OfflineProposer(), executor, 2) == []  # nothing left to do


def test_same_seed_same_pool(tmp_path, demo_csv, executor):
    pools = []
    for name in ("a", "b"):
        store = Store.open(tmp_path / name)
        import_path(store, demo_csv)
        evolve(store, OfflineProposer(), executor, 2, EvolveConfig(seed=7))
        pools.append(store.pool_ids())
    assert pools[0] == pools[1]


class _WithRareCandidate(OfflineProposer):
    """The offline proposer, plus in generation 1 a precise annotator that fires on only two dev rows.

    The gate must reject it (fewer fires than `GateConfig.min_fires`), whatever the data and libraries make of
    the offline candidates, so the test below always has a gate rejection to overrule.
    """

    def propose(self, role, context):
        proposals = super().propose(role, context)
        if role != "generator" or context.generation != 1:
            return proposals
        rows = {ex.text: context.task.labels[ex.label] for ex in context.dev[:2]}
        source = f"RARE = {rows!r}\n\n\ndef annotate(example):\n    return RARE.get(example.get('text'))\n"
        return [*proposals, Candidate(source=source, agent=role, name="two_rows_by_heart")]


def test_human_verdicts_hold_in_later_generations(demo_store, executor):
    evolve(demo_store, _WithRareCandidate(), executor, 1)
    pool = demo_store.pool_ids()
    rare = next(a.id for a in demo_store.annotators() if a.name == "two_rows_by_heart")
    assert demo_store.latest_verdicts()[rare] == ("reject", "gate") and rare not in pool
    assert any("fires 2 <" in reason for reason in demo_store.verdicts(rare)["reasons"][0])
    assert pool, "the offline agents' first generation should admit someone to the pool"
    reject(demo_store, pool[0], "too broad for our guideline")
    approve(demo_store, rare, "the gate was too strict here")
    run_generation(demo_store, _WithRareCandidate(), executor, 2)
    after = demo_store.pool_ids()
    assert pool[0] not in after
    assert rare in after
    # the human verdicts are still the latest ones: the gate did not overrule them
    assert demo_store.human_locked() == {pool[0]: "reject", rare: "approve"}
    assert current_dev_macro_f1(demo_store) == pytest.approx(
        pool_macro_f1(demo_store.vote_matrix(after, FITNESS).votes, demo_store.label_indices(FITNESS), 2))


class _LabelsRowsMidGeneration:
    """The offline agents, while the expert labels pool rows into dev from the studio once the generation began."""

    def __init__(self, store: Store, executor, rows: dict[str, str]):
        self.inner, self.store, self.executor, self.rows = OfflineProposer(), store, executor, rows

    def propose(self, role, context):
        if self.rows:
            from engine.expert.rows import label_rows

            label_rows(self.store, self.executor, self.rows, by="maria")
            self.rows = {}
        return self.inner.propose(role, context)


def test_rows_labeled_into_dev_during_a_generation_join_the_next_one(demo_store, executor):
    evolve(demo_store, OfflineProposer(), executor, 1)
    before = demo_store.example_ids(FITNESS)
    pool = demo_store.examples_frame("pool", limit=40)  # enough rows for the candidates to fire on some
    rows = {i: ("SPAM", "HAM")[k % 2] for k, i in enumerate(pool["id"])}
    proposer = _LabelsRowsMidGeneration(demo_store, executor, rows)
    done = evolve(demo_store, proposer, executor, 3)  # crashed on the candidates' votes outnumbering the labels
    assert [g.number for g in done] == [2, 3] and not proposer.rows
    grown = demo_store.example_ids(FITNESS)
    assert len(grown) == len(before) + 40
    # generation 2 scored its pool on the rows it began with, generation 3 on the grown ones
    members = list(done[0].pool_ids)
    old = demo_store.vote_matrix(members, FITNESS, example_ids=before).votes
    gold_old = demo_store.gold(FITNESS)[[grown.index(i) for i in before]]
    assert pool_macro_f1(old, gold_old, 2) == pytest.approx(done[0].dev_macro_f1_after)
    now = demo_store.vote_matrix(list(done[1].pool_ids), FITNESS).votes
    assert pool_macro_f1(now, demo_store.gold(FITNESS), 2) == pytest.approx(done[1].dev_macro_f1_after)
    # generation 2's candidates were gated on the rows it began with, but their stored scores (what the screens and
    # `evopool pool` show) are on the grown rows
    candidates = [d.annotator_id for d in done[0].decisions if d.decided_by == "gate" and d.verdict != "prune"]
    votes = demo_store.vote_matrix(candidates, FITNESS).votes
    for j, candidate in enumerate(candidates):
        assert demo_store.scores([candidate])[candidate].fires == int((votes[:, j] != -1).sum())


class _LabelsRowsDuringDevRun:
    """A sandbox over which the expert labels pool rows into dev just as a run over dev's rows begins."""

    def __init__(self, inner, store: Store, rows: dict[str, str]):
        self.inner, self.store, self.rows = inner, store, rows

    def run(self, annotators, inputs, labels, **kw):
        if self.rows and len(inputs) == self.store.count_examples("dev"):
            from engine.expert.rows import label_rows

            label_rows(self.store, self.inner, self.rows, by="maria")
            self.rows = {}
        return self.inner.run(annotators, inputs, labels, **kw)


def test_rows_labeled_into_dev_while_the_candidates_run_get_their_votes(demo_store, executor):
    evolve(demo_store, OfflineProposer(), executor, 1)
    pool = demo_store.examples_frame("pool", limit=40)  # enough rows for the candidates to fire on some
    moving = {i: ("SPAM", "HAM")[k % 2] for k, i in enumerate(pool["id"])}
    sandbox = _LabelsRowsDuringDevRun(executor, demo_store, moving)
    done = evolve(demo_store, OfflineProposer(), sandbox, 2)
    assert [g.number for g in done] == [1 + 1] and not sandbox.rows
    # each of generation 2's candidates votes on the moved rows as a fresh sandbox run does (not a left abstain)
    candidates = [d.annotator_id for d in done[0].decisions]
    stored = demo_store.vote_matrix(candidates, "dev", example_ids=list(moving)).votes
    frame = demo_store.examples_frame("dev", ids=list(moving))
    inputs = [{**f, "text": t} for f, t in zip(frame["fields"], frame["text"], strict=True)]
    fresh = {r.annotator_id: r.votes for r in executor.run(demo_store.annotators(candidates), inputs,
                                                           list(demo_store.load_task().labels))}
    order = [list(frame["id"]).index(i) for i in moving]
    expected = [[int(fresh[c][k]) for c in candidates] for k in order]
    assert stored.tolist() == expected and (stored != -1).any()


def test_rows_labeled_into_dev_while_the_agents_context_is_built_keep_its_rows_and_votes_aligned(
        demo_store, executor, monkeypatch):
    """The expert saves rows into dev while the pseudo-labeler fits (between the context's read of dev and of the
    pool's votes): the agents' rows and votes stay the generation's fitness rows, row for row (the votes were read
    after, so they held the new rows too and the improver indexed past dev)."""
    import engine.evolve as evolve_module
    from engine.expert.rows import label_rows

    evolve(demo_store, OfflineProposer(), executor, 1)
    fitness = evolve_module.fitness_rows(demo_store)
    real = evolve_module.pseudo_label

    def expert_saves_meanwhile(*args, **kwargs):
        out = real(*args, **kwargs)
        label_rows(demo_store, executor, {r: "SPAM" for r in demo_store.example_ids("pool")[:5]}, by="maria")
        return out

    monkeypatch.setattr(evolve_module, "pseudo_label", expert_saves_meanwhile)
    context = evolve_module.build_context(demo_store, 2, EvolveConfig(), fitness)
    assert [e.id for e in context.dev] == fitness[0] and context.dev_votes.shape[0] == len(fitness[0])
    members = [a.id for a in context.annotators]
    assert (context.dev_votes == demo_store.vote_matrix(members, FITNESS, example_ids=fitness[0]).votes).all()
    assert len(demo_store.example_ids(FITNESS)) == len(fitness[0]) + 5  # the rows did join dev, for the next one
    assert context.conflicting_dev().max(initial=-1) < len(context.dev)


def _expert_meanwhile(monkeypatch, act) -> None:
    """`act(fresh)` (the generation's candidates) runs as the expert clicks, during the pool-sample sandbox run
    just before the gate."""
    import engine.evolve as evolve_module

    weigh = evolve_module.pool_evidence

    def acting(executor, context, fresh):
        act(fresh)
        return weigh(executor, context, fresh)

    monkeypatch.setattr(evolve_module, "pool_evidence", acting)


def test_a_verdict_the_expert_gives_while_the_gate_weighs_a_candidate_wins(demo_store, executor, monkeypatch):
    evolve(demo_store, OfflineProposer(), executor, 1)
    judged = {}

    def reject_the_first(fresh):
        judged["id"] = fresh[0].id
        reject(demo_store, fresh[0].id, "a wrong cue for our guideline")

    _expert_meanwhile(monkeypatch, reject_the_first)
    run_generation(demo_store, OfflineProposer(), executor, 2)
    assert demo_store.latest_verdicts()[judged["id"]] == ("reject", "human")  # the gate's later row had won
    assert judged["id"] not in demo_store.pool_ids()
    rows = demo_store.verdicts(judged["id"])
    assert "gate" not in set(rows["decided_by"])
    assert rows["note"].iloc[-1] == "a wrong cue for our guideline"  # the reason the agents are shown, not an echo's


def test_a_member_the_expert_rejects_while_a_generation_runs_is_out_of_the_pool_it_judges(demo_store, executor,
                                                                                           monkeypatch):
    evolve(demo_store, OfflineProposer(), executor, 1)
    member = demo_store.pool_ids()[0]
    _expert_meanwhile(monkeypatch, lambda fresh: reject(demo_store, member, "too broad"))
    done = run_generation(demo_store, OfflineProposer(), executor, 2)
    pool = demo_store.pool_ids()
    assert member not in pool and member not in done.pool_ids
    stored = demo_store.generations().iloc[-1]
    assert stored["pool_size"] == len(pool)  # was counted with the rejected member
    assert stored["dev_macro_f1_after"] == pytest.approx(current_dev_macro_f1(demo_store))


def test_an_annotator_the_expert_approves_while_a_generation_runs_is_in_the_pool_it_judges(demo_store, executor,
                                                                                           monkeypatch):
    evolve(demo_store, _WithRareCandidate(), executor, 1)
    rare = next(a.id for a in demo_store.annotators() if a.name == "two_rows_by_heart")
    assert rare not in demo_store.pool_ids()  # rejected by the gate in generation 1
    _expert_meanwhile(monkeypatch, lambda fresh: approve(demo_store, rare, "we want it"))
    done = run_generation(demo_store, OfflineProposer(), executor, 2)
    pool = demo_store.pool_ids()
    assert rare in pool and rare in done.pool_ids
    stored = demo_store.generations().iloc[-1]
    assert stored["pool_size"] == len(pool)  # was counted without the approved annotator
    assert stored["dev_macro_f1_after"] == pytest.approx(current_dev_macro_f1(demo_store))


class _OneIdea:
    """Agents with one idea: a wider SPAM annotator that covers a member's rows more precisely (the gate prunes it)."""

    name = "scripted"

    def propose(self, role, context):
        return [Candidate(WIDER_CAPS, "generator", "wider caps")] if role == "generator" else []


def test_rejecting_a_replacement_while_its_verdicts_are_written_keeps_the_member_it_replaced(demo_store, executor):
    evolve(demo_store, OfflineProposer(), executor, 2)
    before = set(demo_store.pool_ids())
    seen = {}

    def expert_rejects_the_newcomer(kind, payload):  # the studio's Reject, as the generation writes its verdicts
        if kind == EventKind.VERDICT and payload["verdict"] == "accept":
            reject(demo_store, payload["annotator_id"], "I do not want this one")
            seen["newcomer"] = payload["annotator_id"]
        if kind == EventKind.VERDICT and payload["verdict"] == "prune":
            seen.setdefault("pruned", []).append(payload["annotator_id"])

    evolve(demo_store, _OneIdea(), executor, 3, on_event=expert_rejects_the_newcomer)
    assert seen.get("newcomer") and seen.get("pruned")  # the gate took it as a member's replacement
    assert set(demo_store.pool_ids()) == before  # the newcomer is out, so the member it was to replace stays
    assert all(demo_store.latest_verdicts()[m][0] != "prune" for m in seen["pruned"])


def test_undoing_a_verdict_returns_to_the_one_it_overrode_and_leaves_no_lock(demo_store, executor):
    """Undo is not the opposite verdict: the gate's verdict stands again and no human lock is left, so the next
    generation's gate weighs the annotator as before; the agents no longer hear of the undone rejection; undoing an
    expert's second verdict restores their first, a lock again; an annotator the expert never judged refuses."""
    from engine.evolve import expert_feedback
    from engine.expert.review import undo

    evolve(demo_store, _WithRareCandidate(), executor, 1)
    member = demo_store.pool_ids()[0]
    rare = next(a.id for a in demo_store.annotators() if a.name == "two_rows_by_heart")
    reject(demo_store, member, "too broad")
    assert member not in demo_store.pool_ids() and [a.id for a, _ in expert_feedback(demo_store).rejected] == [member]
    assert undo(demo_store, member, "clicked the wrong one") == "accept"
    assert member in demo_store.pool_ids() and member not in demo_store.human_locked()
    assert demo_store.latest_verdicts()[member] == ("accept", "undo")
    assert expert_feedback(demo_store).rejected == ()
    with pytest.raises(ValueError, match="nothing to undo"):
        undo(demo_store, member)
    approve(demo_store, rare, "worth a try")
    reject(demo_store, rare, "no, too narrow")
    assert undo(demo_store, rare) == "approve" and demo_store.human_locked()[rare] == "approve"
    run_generation(demo_store, _WithRareCandidate(), executor, 2)  # the gate echoes the expert's approval
    assert rare in demo_store.pool_ids() and demo_store.latest_verdicts()[rare] == ("approve", "human")
    assert undo(demo_store, rare) == "reject" and rare not in demo_store.human_locked()  # the gate's, as at first
    run_generation(demo_store, _WithRareCandidate(), executor, 3)
    assert member in demo_store.pool_ids() and rare not in demo_store.pool_ids()
    assert demo_store.latest_verdicts()[member][1] != "human"


def test_undo_takes_back_only_the_verdict_shown_and_a_second_reason_is_a_step(demo_store, executor):
    """A second reject with a new reason is a step of its own (only the gate's echoes of a lock are not); an undo
    of a verdict another tab has changed since is refused; an annotator the expert wrote has nothing to undo; the
    manifest names every undo."""
    from engine.expert.review import undo
    from engine.export.files import verdict_record

    evolve(demo_store, OfflineProposer(), executor, 1)
    member = demo_store.pool_ids()[0]
    reject(demo_store, member, "first reason")
    reject(demo_store, member, "second reason")
    shown, verdict = demo_store.undoable(member)
    assert verdict == "reject"
    assert undo(demo_store, member, expected=shown) == "reject" and demo_store.human_locked()[member] == "reject"
    with pytest.raises(ValueError, match="changed since"):
        undo(demo_store, member, expected=shown)  # the screen still shows the undone one
    assert undo(demo_store, member, expected=demo_store.undoable(member)[0]) == "accept"
    assert demo_store.undoable(member) is None
    overrides = verdict_record(demo_store)["expert_overrides"]
    assert [o["verdict"] for o in overrides if o["annotator_id"] == member] == [
        "reject", "reject", "undone (reject restored)", "undone (accept restored)"]


class _CopyOf:
    """Agents whose one idea is a member's code again, with a constant added: a near copy of it."""

    name = "scripted"

    def __init__(self, source: str):
        self.source = source

    def propose(self, role, context):
        copy = self.source + "\nPROPOSED_AGAIN = True\n"  # a comment alone would be the same normalised code
        return [Candidate(copy, "generator", "a member again")] if role == "generator" else []


def test_a_member_an_undo_brings_back_while_a_generation_runs_keeps_its_near_copy_out(demo_store, executor,
                                                                                      monkeypatch):
    """The expert rejects a member, a generation starts without it, and the expert undoes the rejection while the
    gate weighs a near copy of it: the copy is judged beside the member (not admitted next to it)."""
    from engine.expert.review import undo

    evolve(demo_store, OfflineProposer(), executor, 1)
    member = demo_store.pool_ids()[0]
    reject(demo_store, member, "too broad")
    assert member not in demo_store.pool_ids()
    _expert_meanwhile(monkeypatch, lambda fresh: undo(demo_store, member))
    done = run_generation(demo_store, _CopyOf(demo_store.annotator(member).source), executor, 2)
    pool = demo_store.pool_ids()
    assert member in pool and member in done.pool_ids
    (copy,) = [d for d in done.decisions if d.annotator_id != member]
    assert copy.verdict == "reject" and copy.annotator_id not in pool, copy
    assert any("too similar to " + member[:8] in reason for reason in copy.reasons), copy.reasons


def test_restoring_a_version_an_edit_replaced_takes_the_edit_out(demo_store, executor):
    """Saving an edit retires its parent; undoing that retirement brings the parent back in place of the edit, not
    beside it (both voted on the same rows: an expert's walk through the studio counted SPAM twice)."""
    from engine.expert.review import save_edit, undo

    evolve(demo_store, OfflineProposer(), executor, 1)
    parent = demo_store.pool_ids()[0]
    edited = save_edit(demo_store, executor, demo_store.annotator(parent).source + "\nEDITED = True\n", parent,
                       "my wording")
    assert edited.id in demo_store.pool_ids() and parent not in demo_store.pool_ids()
    assert undo(demo_store, parent) == "accept"
    pool = demo_store.pool_ids()
    assert parent in pool and edited.id not in pool
    assert demo_store.latest_verdicts()[edited.id] == ("reject", "human")
    # undoing that restore brings the edit back in place of the parent: never both
    assert undo(demo_store, edited.id) == "approve"
    pool = demo_store.pool_ids()
    assert edited.id in pool and parent not in pool
    # a chain of edits (parent -> edited -> edited again): restoring the parent retires the live one, the last
    again = save_edit(demo_store, executor, edited.source + "\nAGAIN = True\n", edited.id, "once more")
    assert again.id in demo_store.pool_ids() and edited.id not in demo_store.pool_ids()
    assert undo(demo_store, parent) == "accept"
    pool = demo_store.pool_ids()
    assert parent in pool and again.id not in pool and edited.id not in pool
    # a plain rejection undone restores only its annotator
    other = next(a for a in pool if a != parent)
    reject(demo_store, other, "too broad")
    assert undo(demo_store, other) == "accept" and {parent, other} <= set(demo_store.pool_ids())


def test_restoring_a_version_and_retiring_its_edit_is_one_write(demo_store, executor, monkeypatch):
    """The two verdicts of a restore land together or not at all: a generation reading between two writes saw the
    version and its edit in the pool side by side."""
    from engine.expert.review import save_edit, undo
    from engine.store.workspace import Store as StoreClass

    evolve(demo_store, OfflineProposer(), executor, 1)
    parent = demo_store.pool_ids()[0]
    edited = save_edit(demo_store, executor, demo_store.annotator(parent).source + "\nEDITED = True\n", parent, "x")
    before = demo_store.verdicts_version()
    insert = StoreClass._insert_verdict

    def fails_on_the_retirement(self, decision, generation):
        if decision.annotator_id == edited.id:
            raise OSError("disk full")
        return insert(self, decision, generation)

    monkeypatch.setattr(StoreClass, "_insert_verdict", fails_on_the_retirement)
    with pytest.raises(OSError):
        undo(demo_store, parent)
    assert demo_store.verdicts_version() == before  # the restore was rolled back with it
    assert edited.id in demo_store.pool_ids() and parent not in demo_store.pool_ids()


def test_saving_an_edit_and_retiring_its_parent_is_one_write(demo_store, executor, monkeypatch):
    """Saving an edit approves it and retires its parent: a failure of the second write rolls back the first, as an
    undo's restore does (the edit alone, or both versions, in the pool would be a state no one chose)."""
    from engine.expert.review import save_edit
    from engine.store.workspace import Store as StoreClass

    evolve(demo_store, OfflineProposer(), executor, 1)
    parent = demo_store.pool_ids()[0]
    before, pool = demo_store.verdicts_version(), demo_store.pool_ids()
    insert = StoreClass._insert_verdict

    def fails_on_the_retirement(self, decision, generation):
        if decision.annotator_id == parent:
            raise OSError("disk full")
        return insert(self, decision, generation)

    monkeypatch.setattr(StoreClass, "_insert_verdict", fails_on_the_retirement)
    with pytest.raises(OSError):
        save_edit(demo_store, executor, demo_store.annotator(parent).source + "\nEDITED = True\n", parent, "x")
    assert demo_store.verdicts_version() == before and demo_store.pool_ids() == pool


class _WithWrongLabel(OfflineProposer):
    """The offline proposer, plus in generation 1 an annotator that returns a label the task does not have."""

    def propose(self, role, context):
        proposals = super().propose(role, context)
        if role != "generator" or context.generation != 1:
            return proposals
        source = "def annotate(example):\n    return 'PROMOTION' if 'http' in example['text'] else None\n"
        return [*proposals, Candidate(source=source, agent=role, name="wrong_label")]


def test_a_rejected_candidate_says_its_first_fault(demo_store, executor):
    """"fires 0 < 5" alone hid why: the run's first fault (here a label the task lacks) is in the reasons and in the
    verdict's plain words (a review against a small local model)."""
    from engine.expert.review import explain_verdicts

    evolve(demo_store, _WithWrongLabel(), executor, 1)
    wrong = next(a.id for a in demo_store.annotators() if a.name == "wrong_label")
    verdicts = demo_store.verdicts(wrong)
    assert verdicts["verdict"].iloc[-1] == "reject"
    assert any(r.startswith("first fault: returned 'PROMOTION', not a label") for r in verdicts["reasons"].iloc[-1])
    words = " ".join(explain_verdicts(demo_store, verdicts.tail(1))[verdicts.index[-1]].lines)
    assert "Its code went wrong on dev, first: returned \\'PROMOTION\\'\\, not a label" in words


class _FailsForGood(OfflineProposer):
    """An agent whose calls fail for good after the first role succeeded (an LLM server gone mid-generation)."""

    def propose(self, role, context):
        if role == "improver":
            from engine.llm.seam import LLMCallFailed

            raise LLMCallFailed("the improver call failed after 5 attempts: HTTP 500")
        return super().propose(role, context)


def test_a_generation_whose_agent_fails_for_good_is_recorded_failed_not_left_running(demo_store, executor):
    """It stayed "running", which reads as a run still going or one the studio was stopped in (a review against a
    server that failed mid-generation). A rerun redoes it."""
    from engine.llm.seam import LLMCallFailed

    with pytest.raises(LLMCallFailed):
        evolve(demo_store, _FailsForGood(), executor, 1)
    row = demo_store.generations().iloc[-1]
    assert row["status"] == "failed" and "HTTP 500" in row["note"]
    assert demo_store.last_complete_generation() == 0
    evolve(demo_store, OfflineProposer(), executor, 1)
    assert demo_store.last_complete_generation() == 1
