"""Pseudo-labels for the pool sample (engine/pseudo_labels.py) and how the offline selection weighs them."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from engine.agents.base import ProposalContext
from engine.agents.offline.selection import Proposal, SelectConfig, greedy_select
from engine.domain import ABSTAIN, FITNESS, Candidate, Example, Task
from engine.evolve import EvolveConfig, pool_evidence, run_generation
from engine.ingest.importer import IngestOptions, import_frame
from engine.pseudo_labels import MINED_ON_GUESSES, PseudoLabels, _refits, pseudo_label
from engine.sandbox.annotators import make_annotator
from engine.specs.templates import AnnotatorSpec
from engine.store.workspace import Store


def _pseudo(guesses: list[int], k: int, accuracy: float) -> PseudoLabels:
    proba = np.full((len(guesses), k), 0.1)
    proba[np.arange(len(guesses)), guesses] = 0.9
    return PseudoLabels(proba / proba.sum(axis=1, keepdims=True), accuracy)


def test_evidence_undoes_the_classifiers_own_errors_and_weighs_by_its_skill():
    pseudo = _pseudo([0] * 60 + [1] * 40, k=2, accuracy=0.8)
    fired = np.zeros(100, dtype=bool)
    fired[:50] = True  # the classifier agrees with a vote for 0 on all 50 rows
    estimate, weight = pseudo.evidence(fired, 0)
    assert estimate == pytest.approx(1.0)  # (1.0 - 0.2) / (0.8 - 0.2), clipped
    assert weight == pytest.approx(50 * 0.6 ** 2)
    fired[:] = False
    fired[40:80] = True  # agrees on 20 of 40: a = 0.5 -> p = (0.5 - 0.2) / 0.6
    assert pseudo.evidence(fired, 0)[0] == pytest.approx(0.5)
    # a classifier at chance says nothing, however many rows it saw (recall = false rate)
    assert _pseudo([0] * 100, k=2, accuracy=0.5).evidence(fired, 0) == (0.0, 0.0)
    assert pseudo.evidence(np.zeros(100, dtype=bool), 0) == (0.0, 0.0)


def _proposal(label: int, fired_dev: np.ndarray, fired_pool: np.ndarray, cue: str) -> Proposal:
    p = Proposal(AnnotatorSpec("cue", f"c{label}", "sentence", (cue,)), label, fired_dev, prior=1.0)
    p.pool_fired = fired_pool
    return p


def test_selection_drops_a_dev_perfect_cue_the_pool_contradicts():
    gold = np.array([0] * 10 + [1] * 10)
    lucky = np.zeros(20, dtype=bool)
    lucky[:6] = True  # 6 of 6 on dev
    honest = np.zeros(20, dtype=bool)
    honest[10:16] = True
    pool_lucky = np.zeros(300, dtype=bool)
    pool_lucky[:200] = True
    pool_honest = np.zeros(300, dtype=bool)
    pool_honest[200:] = True
    # the classifier (90 % right on dev) guesses class 1 on the lucky cue's pool rows, class 1 on the honest one's
    pseudo = _pseudo([1] * 300, k=2, accuracy=0.9)
    proposals = [_proposal(0, lucky, pool_lucky, "lucky"), _proposal(1, honest, pool_honest, "honest")]
    config = SelectConfig(min_fires=5, cross_fit=False)
    base = np.zeros((20, 2), dtype=np.int64)
    without = greedy_select(proposals, gold, 2, base, [], config)
    assert {p.spec.cues for p in without} == {("lucky",), ("honest",)}
    for p in proposals:
        p.stats.clear()
    evidence = lambda p: pseudo.evidence(p.pool_fired, p.label)  # noqa: E731
    kept = greedy_select(proposals, gold, 2, base, [], config, pool_evidence=evidence)
    assert [p.spec.cues for p in kept] == [("honest",)]
    assert kept[0].stats["pool_precision"] == pytest.approx(1.0)
    assert proposals[0].stats["pool_precision"] == 0.0


def _toy_store(path, scramble_audit: bool, n_dev: int = 120, n_pool: int = 40) -> Store:
    """Two classes told apart by their words; dev rows (half held back as audit rows when there are enough),
    then pool rows; row i is class i % 2 and its text ends with i."""
    rng = np.random.default_rng(0)
    words = {0: ["refund", "money", "back"], 1: ["card", "lost", "stolen"]}
    rows = []
    for i in range(n_dev + n_pool):
        y = i % 2
        split = "dev" if i < n_dev else "pool"
        rows.append({"id": f"r{i}", "text": " ".join(rng.choice(words[y], size=3)) + f" note {i}",
                     "label": ["refund", "card"][y] if split == "dev" else None, "split": split})
    store = Store.open(path)
    import_frame(store, pd.DataFrame(rows), IngestOptions(labels=("refund", "card"), audit_fraction=0.5, seed=1),
                 dataset="toy", source="test")
    if scramble_audit:  # whatever the audit rows say, nothing the agents see may change
        store._q("UPDATE examples SET label = 1 - label WHERE audit")
    return store


def test_pseudo_labels_guess_the_pool_from_the_fitness_rows_only(tmp_path):
    guesses = []
    for scramble in (False, True):
        store = _toy_store(tmp_path / f"ws-{scramble}", scramble)
        dev, pool = store.examples(FITNESS), store.examples("pool")
        assert store.count_examples("audit") > 0 and all(ex.label is None for ex in pool)
        pseudo = pseudo_label(store, dev, pool, seed=0)
        assert pseudo is not None and pseudo.proba.shape == (len(pool), 2)
        truth = np.array([int(ex.id[1:]) % 2 for ex in pool])  # row i is class i % 2 (refund 0, card 1)
        assert np.mean(pseudo.guess == truth) > 0.9 and pseudo.accuracy > 0.9
        guesses.append(pseudo.proba)
    Store.close_all()
    np.testing.assert_allclose(guesses[0], guesses[1])


# written as an LLM or an expert might: not a template, so it runs in the sandbox. It is exact on the dev rows
# (numbered below 40) and wrong on every pool row: on dev alone it looks perfect.
MEMORISER = '''
def annotate(example: dict) -> str | None:
    words = example["text"].split()
    number = int(words[-1])
    refund = "refund" in words or "money" in words or "back" in words
    if number < 40:
        return "refund" if refund else "card"
    return "card" if refund else "refund"
'''


class _OneCandidate:
    name = "scripted"

    def propose(self, role, context):
        if role != "generator":
            return []
        return [Candidate(source=MEMORISER, agent="generator", name="memoriser", rationale="test")]


def test_the_gate_runs_candidates_on_the_pool_sample_and_weighs_the_pseudo_labels(tmp_path):
    from engine.sandbox.executor import SandboxExecutor

    with SandboxExecutor(workers=1) as executor:
        for pseudo in (False, True):
            store = _toy_store(tmp_path / f"evolve-{pseudo}", scramble_audit=False, n_dev=40, n_pool=400)
            generation = run_generation(store, _OneCandidate(), executor, 1, EvolveConfig(pseudo_labels=pseudo))
            (decision,) = generation.decisions
            reasons = " | ".join(decision.reasons)
            if pseudo:
                assert decision.verdict == "reject", reasons
                assert "about 0.00 on the unlabeled sample" in reasons
            else:
                assert decision.verdict == "accept", reasons
    Store.close_all()


def test_a_classifier_near_chance_gives_guesses_but_no_evidence(tmp_path):
    """Words that say nothing about the class: out of fold the classifier is near chance, so its agreement with an
    annotator is no evidence (the improver may still mine its guesses; dev judges what it finds)."""
    rng = np.random.default_rng(1)
    vocabulary = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    rows = [{"id": f"r{i}", "text": " ".join(rng.choice(vocabulary, size=4)), "split": "dev" if i < 120 else "pool",
             "label": ["a", "b"][int(rng.integers(2))] if i < 120 else None} for i in range(200)]
    store = Store.open(tmp_path / "noise")
    import_frame(store, pd.DataFrame(rows), IngestOptions(labels=("a", "b"), audit_fraction=0.0), dataset="noise",
                 source="test")
    pseudo = pseudo_label(store, store.examples(FITNESS), store.examples("pool"))
    assert pseudo is not None and not pseudo.trusted and pseudo.guess.shape == (80,)
    votes = np.where(pseudo.guess == 1, 1, ABSTAIN)  # agrees with every guess it makes
    assert pseudo.evidence_of_votes(votes) == (0.0, 0.0)
    Store.close_all()


def test_untrusted_guesses_are_no_evidence():
    guesses = [0, 1, 1, 0, 1, 1, 0, 1]
    trusted = _pseudo(guesses, 2, accuracy=0.9)
    fired = np.array(guesses) == 1
    assert trusted.evidence(fired, 1)[1] > 0
    assert replace(trusted, trusted=False).evidence(fired, 1) == (0.0, 0.0)


def test_guesses_refitted_on_some_dev_rows_read_those_rows_only():
    """The improver judges what it mines from a half's guesses on the other half: the refit must not see it."""
    x = np.array([[-1.0], [1.0]] * 10)
    first = np.arange(10)  # rows 0..9: left is class 0, right class 1
    second = np.arange(10, 20)  # rows 10..19: the other way round
    y = np.where((x[:, 0] < 0) == (np.arange(20) < 10), 0, 1)
    pool_X = np.array([[-1.0], [1.0]])
    pseudo = PseudoLabels(np.full((2, 2), 0.5), 0.9, dev_X=x, dev_y=y, pool_X=pool_X)
    assert pseudo.guess_from(first).tolist() == [0, 1]
    assert pseudo.guess_from(second).tolist() == [1, 0]
    rows_of = replace(pseudo, dev_ids=tuple(f"d{i}" for i in range(20)))  # named rows: refits are kept
    _refits.clear()
    assert rows_of.guess_from(first).tolist() == rows_of.guess_from(first).tolist() == [0, 1]
    assert len(_refits) == 1  # fitted once per set of rows
    relabeled = replace(rows_of, dev_y=1 - y)  # the same rows, relabeled: a new fit, not the kept one
    assert relabeled.guess_from(first).tolist() == [1, 0] and len(_refits) == 2
    assert PseudoLabels(np.array([[0.2, 0.8]]), 0.9).guess_from(first).tolist() == [1]  # no features: its guesses


class _CountingExecutor:
    """Runs nothing: records which annotators it was asked to run and votes class 1 on every row."""

    def __init__(self):
        self.ran: list[str] = []

    def run(self, annotators, inputs, labels):
        self.ran += [a.id for a in annotators]
        return [SimpleNamespace(votes=[1] * len(inputs)) for _ in annotators]


def test_the_gate_takes_no_evidence_from_untrusted_guesses_or_for_cues_mined_on_them():
    source = 'def annotate(example):\n    """Spam."""\n    return "spam"\n'
    plain = make_annotator(Candidate(source, "improver", rationale="improver: a cue"), 1)
    mined = make_annotator(Candidate(source.replace("Spam.", "Spam!"), "improver",
                                     rationale=f"improver: a cue ({MINED_ON_GUESSES})", mined_on_guesses=True), 1)
    assert mined.mined_on_guesses and not plain.mined_on_guesses
    # the flag, not the words: a rationale that merely says them (an LLM's, say) is weighed like any other
    quoting = make_annotator(Candidate(source.replace("Spam.", "Spam?"), "improver",
                                       rationale=f"improver: not {MINED_ON_GUESSES}"), 1)
    sample = tuple(Example(f"u{i}", "win now", "pool", None) for i in range(8))
    context = ProposalContext(task=Task("t", ("ham", "spam")), dev=(), pool_sample=sample, annotators=(), scores={},
                              dev_votes=np.zeros((0, 0), dtype=np.int64), generation=1, seed=0,
                              pseudo=_pseudo([1] * 8, 2, accuracy=0.9))
    executor = _CountingExecutor()
    evidence = pool_evidence(executor, context, [plain, mined, quoting])
    assert set(evidence) == {plain.id, quoting.id} and executor.ran == [plain.id, quoting.id]
    assert evidence[plain.id][1] > 0
    untrusted = replace(context, pseudo=replace(context.pseudo, trusted=False))
    assert pool_evidence(executor, untrusted, [plain]) is None and executor.ran == [plain.id, quoting.id]  # no run


def test_a_refit_on_some_dev_rows_is_not_served_to_a_workspace_with_other_features():
    """Two workspaces in the studio's one process may share ids (row numbers) and labels, with other texts: the
    refit cached for one was applied to the other's pool, so its guesses were the first workspace's."""
    rng = np.random.default_rng(0)
    y = np.array([0, 1] * 20)
    ids = tuple(str(i) for i in range(1, 41))
    pool = np.zeros((6, 8))
    pool[:, 0] = [3, 3, 3, -3, -3, -3]

    def guesses(sign: int) -> list[int]:
        X = rng.normal(size=(40, 8))
        X[:, 0] += np.where(y == 1, 3, -3) * sign  # class 1 rows lean one way, or the other
        labels = PseudoLabels(np.full((6, 2), 0.5), 0.9, dev_X=X, dev_y=y, pool_X=pool, seed=0, dev_ids=ids)
        return labels.guess_from(np.arange(20)).tolist()

    _refits.clear()
    assert guesses(1) == [1, 1, 1, 0, 0, 0]
    assert guesses(-1) == [0, 0, 0, 1, 1, 1]
