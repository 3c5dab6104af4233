"""The offline proposer: valid, deterministic, readable annotators; roles that do what they say.

The emitted code is executed directly here because it is the proposer's own generated code and the test
needs its votes; production runs always go through engine.sandbox.executor.
"""
from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.agents.base import ProposalContext
from engine.agents.offline.candidates import build_workspace, exception_variants
from engine.agents.offline.cues import ViewIndex
from engine.agents.offline.proposer import OfflineProposer
from engine.agents.offline.roles import broaden, generator_proposals
from engine.agents.offline.selection import Proposal, SelectConfig, _viable, halves
from engine.domain import ABSTAIN, Annotator, Candidate, Example, Task
from engine.metrics.score import score_annotator
from engine.pseudo_labels import PseudoLabels
from engine.sandbox.annotators import make_annotator
from engine.sandbox.checks import ALLOWED_IMPORTS, check_source
from engine.specs.surface import MEASURES
from engine.specs.templates import AnnotatorSpec, parse_spec, render
from engine.text_views import NEAR, NEAR_MIN_SHARE, TEXT_VIEWS, mined_views, view_text

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

SPAM = ["win a free prize now", "free entry call now to win", "claim your prize at www.win.com",
        "urgent call 0800123456 to claim", "free ringtones text WIN to 80086", "you have won a free holiday",
        "congratulations you won cash prize", "call now for free minutes", "win cash now text 88888",
        "free prize draw click http://x.co"]
HAM = ["see you at lunch tomorrow", "i love you mum", "are we still meeting for lunch", "ok see you soon",
       "sorry i am late home soon", "can you pick up milk", "lunch at noon then", "love the pictures thanks",
       "i will be home for dinner", "what time is the movie tonight"]


def _rows(texts: list[str], label: int | None, split: str, prefix: str) -> list[Example]:
    return [Example(f"{prefix}{i}", t, split, label) for i, t in enumerate(texts)]


def _spam_task() -> Task:
    return Task(name="sms-tiny", labels=("ham", "spam"))


def _spam_dev() -> tuple[Example, ...]:
    spam = [f"{t} {w}" for w in ("", "today", "!!") for t in SPAM]
    ham = [f"{t} {w}" for w in ("", "today", "x") for t in HAM]
    return tuple(_rows(ham, 0, "dev", "h") + _rows(spam, 1, "dev", "s"))


def _context(task: Task, dev: tuple[Example, ...], pool: list[Annotator] = (), seed: int = 0,
             generation: int = 1) -> ProposalContext:
    pool = list(pool)
    inputs = [ex.as_input() for ex in dev]
    y = np.array([ex.label for ex in dev])
    votes = np.column_stack([_votes(a.source, inputs, task.labels) for a in pool]) if pool \
        else np.zeros((len(dev), 0), dtype=np.int64)
    scores = {a.id: score_annotator(a.id, votes[:, j], y) for j, a in enumerate(pool)}
    unlabeled = tuple(Example(f"p{i}", ex.text, "pool", None, dict(ex.fields)) for i, ex in enumerate(dev))
    return ProposalContext(task=task, dev=dev, pool_sample=unlabeled, annotators=tuple(pool), scores=scores,
                           dev_votes=votes, generation=generation, seed=seed)


def _member(spec: AnnotatorSpec) -> Annotator:
    """A pool member written by the offline templates (as if accepted in an earlier generation)."""
    return make_annotator(Candidate(render(spec), "generator", name=spec.describe()[:40]), 1)


def _annotate_fn(source: str):
    namespace: dict = {}
    exec(compile(source, "<annotator>", "exec"), namespace)  # own generated code (product: the sandbox)
    return namespace["annotate"]


def _votes(source: str, inputs: list[dict], labels: tuple[str, ...]) -> np.ndarray:
    annotate = _annotate_fn(source)
    out = [annotate(ex) for ex in inputs]
    assert all(o is None or o in labels for o in out), f"invalid label in {set(out)}"
    return np.array([ABSTAIN if o is None else labels.index(o) for o in out], dtype=np.int64)


def _imports(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def _check_candidates(cands: list[Candidate], task: Task, inputs: list[dict]) -> None:
    for c in cands:
        check_source(c.source)  # parses, allowed imports, no dunders / eval / open ...
        assert _imports(c.source) <= ALLOWED_IMPORTS
        tree = ast.parse(c.source)
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "annotate")
        assert ast.get_docstring(fn), "annotate needs a one-line docstring"
        assert ast.get_docstring(tree), "the module says what the annotator does"
        votes = _votes(c.source, inputs, task.labels)
        assert (votes != ABSTAIN).any()
        annotate = _annotate_fn(c.source)
        for broken in ({}, {"text": None}, {"text": "x", "span1": None, "span2": [1]}, {"text": 3}):
            assert annotate(broken) in (None, *task.labels)


def test_generator_emits_valid_readable_annotators():
    task, dev = _spam_task(), _spam_dev()
    cands = OfflineProposer().propose("generator", _context(task, dev))
    assert cands and all(c.agent == "generator" and c.name and c.rationale for c in cands)
    _check_candidates(cands, task, [ex.as_input() for ex in dev])
    y = np.array([ex.label for ex in dev])
    best = _votes(cands[0].source, [ex.as_input() for ex in dev], task.labels)
    assert score_annotator("a", best, y).precision >= 0.8  # the first pick is a strong cue on this toy set


def test_same_seed_same_sources_and_new_seed_runs():
    task, dev = _spam_task(), _spam_dev()
    for role in ("generator", "improver", "refiner"):
        a = [c.source for c in OfflineProposer().propose(role, _context(task, dev, seed=3))]
        b = [c.source for c in OfflineProposer().propose(role, _context(task, dev, seed=3))]
        assert a == b
    assert OfflineProposer().propose("generator", _context(task, dev, seed=4))


def test_unknown_role_is_an_error():
    with pytest.raises(ValueError):
        OfflineProposer().propose("critic", _context(_spam_task(), _spam_dev()))


def test_improver_targets_the_weak_class():
    task, dev = _spam_task(), _spam_dev()
    spam_rule = _member(AnnotatorSpec("cue", "spam", "sentence", ("free", "win*", "prize")))
    context = _context(task, dev, [spam_rule])
    assert context.scores[spam_rule.id].precision == 1.0  # ham is never voted: F1 0 -> the weak class
    cands = OfflineProposer().propose("improver", context)
    labels = [parse_spec(c.source).label for c in cands]
    assert labels and labels[0] == "ham"  # the weak class first; uncovered spam rows may follow
    _check_candidates(cands, task, [ex.as_input() for ex in dev])


def _narrow_member_context() -> tuple[Task, tuple[Example, ...], Annotator, ProposalContext]:
    """80 dev rows (enough to mine on halves) and a pool of one precise, narrow spam cue for the refiner."""
    task = _spam_task()
    spam = [f"{t} {w}" for w in ("", "today", "x", "pal") for t in SPAM]
    ham = [f"{t} {w}" for w in ("", "today", "x", "pal") for t in HAM]
    dev = tuple(_rows(ham, 0, "dev", "h") + _rows(spam, 1, "dev", "s"))
    narrow = _member(AnnotatorSpec("cue", "spam", "sentence", ("urgent",)))
    return task, dev, narrow, _context(task, dev, [narrow])


def test_refiner_widens_a_narrow_precise_member_and_names_its_parent():
    task, dev, narrow, context = _narrow_member_context()
    score = context.scores[narrow.id]
    assert score.precision >= 0.55 and score.coverage <= 0.08
    cands = OfflineProposer().propose("refiner", context)
    assert cands
    inputs = [ex.as_input() for ex in dev] + [{"text": "urgent please"}, {"text": "URGENT claim"}]
    parent = _votes(narrow.source, inputs, task.labels) != ABSTAIN
    for c in cands:
        assert c.parent_ids == (narrow.id,) and c.agent == "refiner"
        fired = _votes(c.source, inputs, task.labels) != ABSTAIN
        assert np.all(fired[parent]) and fired.sum() > parent.sum()


def test_the_refiner_judges_the_cues_it_adds_on_the_half_of_dev_they_were_not_mined_on():
    """The cues the refiner adds to a member are read off dev's labels like the generator's: on a dev big enough for
    halves they are mined on one half and judged on the other (the rationale says which); its other widenings (fewer
    conditions, a wider view, stems, the pool's co-occurring words) read no label and all of dev judges them."""
    task, dev, narrow, context = _narrow_member_context()
    proposer = OfflineProposer()
    ws = proposer._workspace(context)
    refined = proposer._refined(ws, context, 0.25, halved=True)
    added = [p for p in refined if "added cues" in p.note]
    free = [p for p in refined if "added cues" not in p.note]
    assert added and free
    parts = [np.isin(np.arange(len(dev)), half) for half in halves(ws.y)]
    assert all(any(np.array_equal(p.held, part) for part in parts) for p in added)
    assert all(p.held is None for p in free)
    inputs = [ex.as_input() for ex in dev]
    for p in refined:  # fired on all of dev, as the emitted code fires
        assert np.array_equal(p.fired, _votes(render(p.spec), inputs, task.labels) != ABSTAIN)
    cands = proposer.propose("refiner", context)
    assert cands and all(("not mined on" in c.rationale) == ("added cues" in c.rationale) for c in cands)
    whole = OfflineProposer(select=SelectConfig(cross_fit=False)).propose("refiner", context)
    assert whole and not any("not mined on" in c.rationale for c in whole)


def test_the_refiner_can_judge_its_added_cues_outside_the_rows_its_member_fires_on():
    """`SelectConfig.refiner_judged_outside_member`: the held half of an added cue leaves out the member's own fires
    (the gate chose the member on them), each proposal with a mask of its own, and the rationale says so; off (the
    default), the whole held half, shared by the half's proposals."""
    task, dev, narrow, context = _narrow_member_context()
    member = _votes(narrow.source, [ex.as_input() for ex in dev], task.labels) != ABSTAIN
    said = {}
    for outside in (False, True):
        proposer = OfflineProposer(select=SelectConfig(refiner_judged_outside_member=outside))
        ws = proposer._workspace(context)
        half_masks = [np.isin(np.arange(len(dev)), half) for half in halves(ws.y)]
        assert all((member & part).any() for part in half_masks)  # so leaving the member's rows out shows
        added = [p for p in proposer._refined(ws, context, 0.25, halved=True) if "added cues" in p.note]
        assert len(added) >= 2
        parts = [part & ~member if outside else part for part in half_masks]
        assert all(any(np.array_equal(p.held, part) for part in parts) for p in added)
        assert all(p.held_outside_member == outside for p in added)
        shared = any(p.held is q.held for i, p in enumerate(added) for q in added[i + 1:])
        assert shared != outside  # on: a new mask each, so no proposal's change reaches another's
        said[outside] = [c.rationale for c in proposer.propose("refiner", context) if "added cues" in c.rationale]
    assert said[True] and all("outside the rows its member fires on" in r for r in said[True])
    assert said[False] and not any("its member" in r for r in said[False])


def test_refiner_skips_foreign_code():
    task, dev = _spam_task(), _spam_dev()
    source = 'def annotate(example):\n    """Spam if it says claim."""\n    return "spam" if "claim" in ' \
             'example.get("text", "") else None\n'
    foreign = make_annotator(Candidate(source, "human"), 1)
    assert OfflineProposer().propose("refiner", _context(task, dev, [foreign])) == []


def test_no_candidate_repeats_a_pool_member_or_an_excluded_one():
    task, dev = _spam_task(), _spam_dev()
    first = OfflineProposer().propose("generator", _context(task, dev))
    member = make_annotator(first[0], 1)
    again = OfflineProposer().propose("generator", _context(task, dev, [member]))
    assert member.source not in {check_source(c.source) for c in again}
    excluded = make_annotator(first[1], 1)
    ctx = _context(task, dev)
    ctx = ProposalContext(**{**ctx.__dict__, "excluded_ids": frozenset({excluded.id})})
    proposed = {check_source(c.source) for c in OfflineProposer().propose("generator", ctx)}
    assert excluded.source not in proposed


RELATION_ROWS = [
    # (text, entity1, entity2, label): the cue sits between the entities
    ("aspirin strongly inhibits COX1 in cells", "COX1", "aspirin", "Down"),
    ("ibuprofen inhibits COX2 activity", "COX2", "ibuprofen", "Down"),
    ("drug X blocks the receptor R1 here", "R1", "drug X", "Down"),
    ("compound Y inhibited kinase K2", "kinase K2", "compound Y", "Down"),
    ("we saw that Z inhibits P3 strongly", "P3", "Z", "Down"),
    ("the drug Q inhibits enzyme E4 fully", "E4", "Q", "Down"),
    ("agent W activates the channel C1", "C1", "agent W", "Up"),
    ("molecule V activates P5 in vivo", "P5", "molecule V", "Up"),
    ("ligand L induces expression of G6", "G6", "ligand L", "Up"),
    ("hormone H activated receptor R7", "R7", "hormone H", "Up"),
    ("substance S activates kinase K8", "K8", "substance S", "Up"),
    ("factor D induces enzyme E9", "E9", "factor D", "Up"),
]


def _relation_dev() -> tuple[Example, ...]:
    out = []
    for i, (text, e1, e2, label) in enumerate(RELATION_ROWS * 2):
        s1, s2 = text.index(e1), text.index(e2)
        fields = {"entity1": e1, "entity2": e2, "span1": [s1, s1 + len(e1)], "span2": [s2, s2 + len(e2)]}
        out.append(Example(f"r{i}", text, "dev", ["Down", "Up"].index(label), fields))
    return tuple(out)


def test_relation_task_gets_entity_context_cues_that_vote_on_new_examples():
    task = Task(name="rel-tiny", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    dev = _relation_dev()
    cands = OfflineProposer().propose("generator", _context(task, dev))
    _check_candidates(cands, task, [ex.as_input() for ex in dev])
    text = "the new drug N inhibits the kinase T1"
    new = {"text": text, "entity1": "T1", "entity2": "N", "span1": [text.index("T1"), len(text)],
           "span2": [text.index("N"), text.index("N") + 1]}
    votes = [v for v in (_annotate_fn(c.source)(new) for c in cands) if v is not None]
    assert votes and votes.count("Down") > votes.count("Up")
    assert any(parse_spec(c.source).view == "between" for c in cands)


def test_near_is_mined_only_where_it_is_not_a_copy_of_between():
    fields = ("entity1", "entity2", "span1", "span2")
    close = [_relation_example(f"drug D{i} inhibits K{i} here", f"D{i}", f"K{i}") for i in range(4)]
    apart = _relation_example("drug D9 in a long aside of many words binds K9", "D9", "K9")
    untouched = _relation_example("D8K8 joined", "D8", "K8")  # no words between: does not count either way
    assert NEAR_MIN_SHARE == 0.25
    assert "near" not in mined_views(fields, close + [apart, untouched])  # 1 of 5 rows apart
    assert "near" in mined_views(fields, close[:3] + [apart, untouched])  # 1 of 4
    assert "near" not in mined_views(fields, close)
    assert mined_views(("span1",), close) == TEXT_VIEWS
    five, six = ("drug D7 " + " ".join(["w"] * n) + " K7" for n in (NEAR, NEAR + 1))  # the limit itself
    assert "near" not in mined_views(fields, close[:3] + [_relation_example(five, "D7", "K7")])
    assert "near" in mined_views(fields, close[:3] + [_relation_example(six, "D7", "K7")])


def test_a_near_member_fires_where_near_is_not_mined_and_widens_to_between():
    """An LLM or an expert may write a near annotator where the agents do not mine the view: the workspace still
    sees where it fires (pool coverage, the refiner), and the refiner's first widening is any distance."""
    task = Task(name="rel-tiny", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    dev = _relation_dev()
    inputs = [ex.as_input() for ex in dev]
    assert "near" not in mined_views(task.fields, inputs)  # every row of this set has its mentions close
    ws = OfflineProposer()._workspace(_context(task, dev))
    near = AnnotatorSpec("cue", "Down", "near", ("inhibit*",))
    emitted = _votes(render(near), inputs, task.labels) != ABSTAIN
    assert emitted.any() and np.array_equal(ws.fires(near), emitted)
    assert "near" not in ws.views
    widened = [spec for spec, _ in broaden(ws, near, 0, 0.0)]
    assert replace(near, view="between") in widened and replace(near, view="sentence") in widened


def _relation_example(text: str, first: str, second: str) -> dict:
    s1, s2 = text.index(first), text.index(second)
    return {"text": text, "entity1": first, "entity2": second, "span1": [s1, s1 + len(first)],
            "span2": [s2, s2 + len(second)]}


def test_a_trigger_next_to_both_mentions_gets_the_near_view():
    """'inhibits kinase' right between the mentions means Down; far between them (in an aside) it does not, so
    its words are only precise cues in the near view (at most NEAR words between): the generator writes one."""
    tails = ("in cells", "in mice", "in vitro", "at low doses", "here", "strongly")  # in both classes: no cue
    near = [f"drug D{i} inhibits kinase K{i} {tail}" for i, tail in enumerate(tails)]
    asides = ("activates, as serum", "raises, while a toxin", "boosts, though an agent", "spares, whereas lipid",
              "stabilises, as one peptide", "induces, while ligand")
    links = ("then", "so", "and", "yet", "but", "hence")
    far = [f"drug D{i} {aside} inhibits kinase, {link} K{i} {tail}"  # varied words: no veto singles them out
           for i, (aside, link, tail) in enumerate(zip(asides, links, tails, strict=True))]
    rows = [(t, "Down", i) for i, t in enumerate(near)] + [(t, "Up", i) for i, t in enumerate(far)]
    dev = tuple(Example(f"r{n}", text, "dev", ["Down", "Up"].index(label),
                        {k: v for k, v in _relation_example(text, f"D{i}", f"K{i}").items() if k != "text"})
                for n, (text, label, i) in enumerate(rows * 2))
    task = Task(name="rel-near", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    cands = OfflineProposer().propose("generator", _context(task, dev))
    _check_candidates(cands, task, [ex.as_input() for ex in dev])
    down = [parse_spec(c.source) for c in cands if parse_spec(c.source).label == "Down"]
    near_down = [spec for spec in down if spec.view == "near"]
    assert near_down, down
    source = render(near_down[0])
    assert _votes(source, [_relation_example("drug A inhibits kinase B strongly", "A", "B")], task.labels)[0] == 0
    far_text = "drug A raises, as a toxin inhibits kinase, so B"
    assert _votes(source, [_relation_example(far_text, "A", "B")], task.labels)[0] == ABSTAIN


def test_a_negation_between_the_mentions_vetoes_a_cue_there_and_not_elsewhere():
    """'did not inhibit' between a pair names no Down relation for it; a 'not' outside the pair says nothing about
    it. A veto on 'not' anywhere in the text would also silence the right votes, so the miner reads it between the
    mentions, and the emitted code votes as mined."""
    verbs = ("inhibits", "can inhibit", "inhibited")
    rows = [(f"drug D{i} {verb} kinase K{i}", "Down") for i, verb in enumerate(verbs)]
    rows += [(f"aspirin did not inhibit it, yet drug D{i} inhibits kinase K{i}", "Down") for i in range(3, 6)]
    negated = ("did not inhibit", "does not really inhibit", "can not fully inhibit")
    rows += [(f"drug D{i} {words} kinase K{i}", "Up") for i, words in zip(range(6, 9), negated, strict=True)]
    dev = tuple(Example(f"r{n}", text, "dev", ["Down", "Up"].index(label),
                        {k: v for k, v in _relation_example(text, f"D{n % 9}", f"K{n % 9}").items() if k != "text"})
                for n, (text, label) in enumerate(rows * 2))
    task = Task(name="rel-neg", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    inputs = [ex.as_input() for ex in dev]
    ws = build_workspace(task, inputs, np.array([ex.label for ex in dev]), inputs, ("between", "sentence"))
    plain = AnnotatorSpec("cue", "Down", "sentence", ("inhibit*",))
    proposal = Proposal(plain, 0, ws.fires(plain), prior=1.0)
    [vetoed] = exception_variants(ws, [proposal])
    assert (vetoed.spec.unless, vetoed.spec.unless_view) == (("not",), "between")
    emitted = _votes(render(vetoed.spec), inputs, task.labels) != ABSTAIN
    assert np.array_equal(emitted, np.array([ex.label == 0 for ex in dev])) and np.array_equal(vetoed.fired, emitted)
    assert "not between the two entity mentions" in vetoed.spec.describe()


def test_a_veto_in_a_view_nobody_mines_is_indexed_when_asked_and_odd_veto_views_are_refused():
    """An expert's or an LLM's annotator may veto in a view this workspace does not mine: its mined fired rows are
    still the code's (the view is indexed on demand), not 'fires nowhere'. A veto view that is not a view name
    makes `parse_spec` give up (the annotator then runs in the sandbox), never raise."""
    task = Task(name="rel-tiny", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    inputs = [ex.as_input() for ex in _relation_dev()]
    ws = build_workspace(task, inputs, np.array([ex.label for ex in _relation_dev()]), inputs, ("between", "sentence"))
    spec = AnnotatorSpec("cue", "Down", "between", ("inhibit*", "block*"), unless=("the",), unless_view="lead")
    emitted = _votes(render(spec), inputs, task.labels) != ABSTAIN
    assert emitted.any() and (emitted != (ws.fires(replace(spec, unless=(), unless_view="sentence")))).any()
    assert np.array_equal(ws.fires(spec), emitted) and np.array_equal(ws.fires(spec, "pool"), emitted)
    source = render(AnnotatorSpec("cue", "Down", "between", ("inhibit*",), unless=("not",), unless_view="between"))
    for odd in ("[]", "{}", "('between',)", "None", "'nonsense'"):
        assert parse_spec(source.replace('UNLESS_VIEW = "between"', f"UNLESS_VIEW = {odd}")) is None, odd
    plain = AnnotatorSpec("cue", "Down", "between", ("inhibit*",))
    no_veto = render(plain).replace("CUES =", 'UNLESS_VIEW = "near"\nCUES =')
    assert parse_spec(no_veto) == plain  # no veto words: nowhere to look for them


@pytest.mark.parametrize("spec", [
    AnnotatorSpec("cue", "Up", "between", ("activat*", "induces")),
    AnnotatorSpec("cue", "Down", "sentence", ("inhibit*",), also=("drug",), unless=("activates",)),
    AnnotatorSpec("cue", "Up", "before", ("the",)),
    AnnotatorSpec("cue", "Down", "after", ("in cells", "strongly")),
    AnnotatorSpec("cue", "Up", "entity2", ("*and", "molecule")),
    AnnotatorSpec("cue", "Down", "lead", ("aspirin strongly",)),
    AnnotatorSpec("cue", "Up", "near", ("activat*", "induces")),
    AnnotatorSpec("cue", "Down", "sentence", ("inhibit*",), unless=("not",), unless_view="between"),
    AnnotatorSpec("cue", "Down", "between", ("inhibit*",), unless=("not",), unless_view="between"),
    AnnotatorSpec("cue", "Down", "near", ("inhibit*",), unless=("not", "no"), unless_view="between"),
])
def test_mined_fired_rows_match_the_emitted_code(spec):
    task = Task(name="rel-tiny", labels=("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))
    dev = _relation_dev()
    # and rows whose mentions are far apart (more than NEAR words between them: "near" is empty there)
    far = [_relation_example(f"agent A{i} in cells, as reported, strongly activates and induces kinase K{i}",
                             f"A{i}", f"K{i}") for i in range(2)]
    # and a negation between the mentions, or outside them (a veto read between the mentions tells them apart)
    far += [_relation_example("drug N1 did not inhibit kinase T1", "N1", "T1"),
            _relation_example("not surprisingly drug N2 inhibits kinase T2", "N2", "T2")]
    inputs = [ex.as_input() for ex in dev] + far
    views = ("between", "near", "sentence", "before", "after", "entity1", "entity2", "lead")
    ws = build_workspace(task, inputs, np.array([ex.label for ex in dev] + [1, 1, 1, 0]), inputs, views)
    assert parse_spec(render(spec)) == spec
    emitted = _votes(render(spec), inputs, task.labels) != ABSTAIN
    if spec.unless_view == "between":  # the negated pair is vetoed, the pair negated elsewhere is not
        assert list(emitted[-2:]) == [False, True]
    assert np.array_equal(ws.fires(spec), emitted)
    assert np.array_equal(ws.fires(spec, "pool"), emitted)


def test_view_helpers_agree_with_mining_on_awkward_spans():
    text = "Alpha-beta binds (gamma) and then delta"
    spans = [([0, 10], [18, 23]), ([18, 23], [0, 10]), ([0, 20], [5, 9]), ([0, 3], [5.5, 9]), ("ab", [0, 1]),
             ([0, 3, 4], [5, 6]), (None, [1, 2])]
    cases = [{"text": text, "span1": a, "span2": b} for a, b in spans]
    cases += [{"text": text}, {}, {"span1": [0, 1]}]
    far = "A one two three four five six B"  # six words between the mentions: too far for "near"
    cases += [{"text": far, "span1": [0, 1], "span2": [30, 31]}, {"text": far, "span1": [0, 1], "span2": [26, 31]}]
    for view in ("between", "near", "before", "after", "entity1", "sentence", "lead"):
        spec = AnnotatorSpec("cue", "Up", view, ("x",))
        namespace: dict = {}
        exec(compile(render(spec), "<annotator>", "exec"), namespace)  # own generated code
        for case in cases:
            assert namespace["view"](case) == view_text(case, view), (view, case)


def test_surface_annotators_measure_what_mining_measures():
    texts = ["WIN £100 CASH now!!! call 08001234567", "see you later", "", "www.example.com has 3 links.com"]
    for feature, fn in MEASURES.items():
        spec = AnnotatorSpec("surface", "spam", feature=feature, op=">=", threshold=1)
        source = render(spec)
        check_source(source)
        assert parse_spec(source) == spec
        namespace: dict = {}
        exec(compile(source, "<annotator>", "exec"), namespace)  # own generated code
        for t in texts:
            assert namespace["measure"](t) == fn(t), (feature, t)


def test_prefix_and_ending_columns_count_exactly():
    rows = [{"text": "inhibits", "entity1": "decarboxylase"},
            {"text": "inhibitor binding", "entity1": "kinase"}, {"text": "in hibit", "entity1": "ase"}]
    index = ViewIndex(rows, ("sentence", "entity1"))
    assert index.fires("sentence", ["inhibit*"]).tolist() == [True, True, False]
    assert index.fires("sentence", ["inhibitor binding"]).tolist() == [False, True, False]
    assert index.fires("entity1", ["*ase"]).tolist() == [True, True, True]
    assert index.fires("entity1", ["*lase"]).tolist() == [True, False, False]
    assert index.fires("sentence", ["unseen*", "never"]).tolist() == [False, False, False]


@pytest.mark.shared_data
def test_youtube_generator_finds_spam_cues():
    folder = SHARED_DATA / "youtube"
    if not folder.exists():
        pytest.skip(f"{folder} is absent (real WRENCH data lives in ../shared/data)")
    names = json.loads((folder / "label.json").read_text())
    task = Task(name="youtube", labels=tuple(names[str(i)] for i in range(len(names))))
    valid = json.loads((folder / "valid.json").read_text())
    dev = tuple(Example(k, r["data"]["text"], "dev", r["label"]) for k, r in valid.items())
    cands = OfflineProposer().propose("generator", _context(task, dev))
    assert len(cands) >= 5
    inputs, y = [ex.as_input() for ex in dev], np.array([ex.label for ex in dev])
    precisions = [score_annotator("a", _votes(c.source, inputs, task.labels), y).precision for c in cands]
    assert min(precisions) >= 0.3 and max(precisions) >= 0.8


def test_awkward_label_names_survive_rendering():
    for label in ('say "hi"', "back\\slash", "naïve / ünïcode", "tri'''ple"):
        for spec in (AnnotatorSpec("cue", label, "sentence", ("hello",)),
                     AnnotatorSpec("surface", label, feature="words", op="<=", threshold=3)):
            source = render(spec)
            check_source(source)
            assert _annotate_fn(source)({"text": "hello there"}) == label
            assert parse_spec(source) == spec


def test_a_mined_proposal_is_judged_on_the_half_it_was_not_mined_on():
    """Right on every row of the half a cue was mined on, wrong on every row of the other: chance, not a cue."""
    gold = np.array([1] * 12 + [0] * 48)
    first, second = halves(gold)
    fired = np.zeros(60, dtype=bool)
    fired[[i for i in first if gold[i] == 1][:5] + [i for i in second if gold[i] == 0][:5]] = True
    spec = AnnotatorSpec("cue", "spam", "sentence", ("free",))
    config = SelectConfig(min_precision=0.3)
    on_second = Proposal(spec, 1, fired, held=np.isin(np.arange(60), second))
    assert not _viable(on_second, gold, config) and on_second.stats["precision"] == 0.0
    on_first = Proposal(spec, 1, fired, held=np.isin(np.arange(60), first))
    assert _viable(on_first, gold, config) and on_first.stats["fires"] == 5  # half the fires asked, rounded up
    on_all = Proposal(spec, 1, fired)  # no held half: judged on all of dev, 5 of 10 (bound 0.29 at z 1.5)
    assert not _viable(on_all, gold, config) and on_all.stats["fires"] == 10 and on_all.stats["precision"] == 0.5


def test_a_cue_judged_on_its_held_half_needs_half_the_fires_rounded_up():
    gold = np.array([1] * 12 + [0] * 48)
    first, second = halves(gold)
    held = np.isin(np.arange(60), second)
    right = [i for i in second if gold[i] == 1]
    spec = AnnotatorSpec("cue", "spam", "sentence", ("free",))
    config = SelectConfig(min_precision=0.3, min_fires=5)
    for fires, viable in ((3, True), (2, False)):
        fired = np.zeros(60, dtype=bool)
        fired[right[:fires] + [i for i in first if gold[i] == 1]] = True  # the mined half's fires do not count
        assert _viable(Proposal(spec, 1, fired, held=held), gold, config) is viable


def test_the_generator_mines_each_half_of_dev_and_judges_each_cue_on_the_other():
    task, dev = _spam_task(), _spam_dev()
    context = _context(task, dev)
    proposer = OfflineProposer()
    ws = proposer._workspace(context)
    parts = [np.isin(np.arange(len(dev)), half) for half in halves(ws.y)]
    rng = np.random.default_rng(0)
    proposals = proposer._cross_fitted(ws, context, lambda sub, rows: generator_proposals(sub, rng, 0.3))
    mined = [p for p in proposals if p.mined]
    assert mined and all(any(np.array_equal(p.held, part) for part in parts) for p in mined)
    assert {tuple(p.held) for p in mined} == {tuple(part) for part in parts}  # both halves mined
    inputs = [ex.as_input() for ex in dev]
    for p in proposals:  # fired on all of dev, as the emitted code fires
        assert np.array_equal(p.fired, _votes(render(p.spec), inputs, task.labels) != ABSTAIN)
    assert all(p.held is None for p in proposals if not p.mined)  # seeded from the label names: all of dev
    assert len({render(p.spec) for p in proposals}) == len(proposals)
    # what reaches the gate says where its precision was read
    cands = proposer.propose("generator", context)
    assert cands and all("not mined on" in c.rationale for c in cands if "seeded" not in c.rationale)
    for select in (SelectConfig(cross_fit=False), SelectConfig(mine_halves=False)):
        plain = OfflineProposer(select=select).propose("generator", context)
        assert plain and not any("not mined on" in c.rationale for c in plain)


def test_a_spec_both_mined_and_seeded_is_kept_once_as_seeded():
    task, dev = _spam_task(), _spam_dev()
    context = _context(task, dev)
    proposer = OfflineProposer()
    ws = proposer._workspace(context)
    spec = AnnotatorSpec("cue", "spam", "sentence", ("free",))

    def mine(sub, rows):  # the first half mines the cue, the second seeds the same spec from a label's words
        first = bool(rows[0] == halves(ws.y)[0][0])
        return [Proposal(spec, 1, sub.fires(spec, "dev"), mined=first)]

    kept = proposer._cross_fitted(ws, context, mine)
    assert len(kept) == 1 and kept[0].mined is False and kept[0].held is None


def _guessed_context(guess_of: dict[str, int], rows_per_word: int = 30) -> tuple[Task, ProposalContext]:
    """The spam task with a spam rule in the pool (ham is the weak class) and an unlabeled sample whose rows each
    carry one word of `guess_of`, guessed as that word's class by a (made-up) dev-fitted classifier."""
    task, dev = _spam_task(), _spam_dev()
    spam_rule = _member(AnnotatorSpec("cue", "spam", "sentence", ("free", "win*", "prize")))
    context = _context(task, dev, [spam_rule])
    texts, guesses = [], []
    for word, label in guess_of.items():
        for i in range(rows_per_word):
            texts.append(f"{word} plan number {i}")
            guesses.append(label)
    sample = tuple(Example(f"u{i}", t, "pool", None) for i, t in enumerate(texts))
    proba = np.full((len(texts), 2), 0.1)
    proba[np.arange(len(texts)), guesses] = 0.9
    return task, replace(context, pool_sample=sample, pseudo=PseudoLabels(proba, accuracy=0.9))


def test_the_improver_mines_the_guessed_pool_rows_and_dev_judges_what_it_finds():
    # "lunch" is ham on dev (9 rows) and guessed ham on the sample; "free" is guessed ham too, but dev says spam
    task, context = _guessed_context({"lunch": 0, "free": 0})
    cands = OfflineProposer().propose("improver", context)
    guessed = [c for c in cands if "guessed labels" in c.rationale]
    assert guessed, [c.rationale for c in cands]
    assert [c for c in cands if c.mined_on_guesses] == guessed  # the flag the gate reads marks exactly those
    specs = [parse_spec(c.source) for c in guessed]
    assert any(s.label == "ham" and "lunch" in s.cues for s in specs)
    assert not any("free" in s.cues for s in specs)  # 18 spam rows on dev: not viable for ham
    for c in guessed:  # too few rows to refit per half: judged on all of dev, which fitted the classifier
        assert ". On dev it fires" in c.rationale
    # on the pool's guesses the improver does not also mine dev's failing rows (its seeds are not mined)
    assert all("guessed labels" in c.rationale or "seeded" in c.rationale for c in cands)
    _check_candidates(cands, task, [ex.as_input() for ex in context.dev])


def test_the_improver_mines_dev_without_guesses_or_with_the_switch_off():
    task, context = _guessed_context({"dinner": 0})
    for proposer, ctx in ((OfflineProposer(), replace(context, pseudo=None)),
                          (OfflineProposer(select=SelectConfig(improve_on_pool=False)), context)):
        cands = proposer.propose("improver", ctx)
        assert cands and not any("guessed labels" in c.rationale for c in cands)
        assert all(c.rationale.startswith("improver: ") and ". On dev it fires" in c.rationale for c in cands)


def test_with_enough_dev_rows_the_guesses_are_refitted_per_half_and_judged_on_the_other(monkeypatch):
    import engine.agents.offline.proposer as offline

    task, context = _guessed_context({"lunch": 0, "free": 1})
    y = context.dev_labels
    dev_X = np.array([[float(ex.label)] for ex in context.dev])  # a feature that is the label: a perfect refit
    pool_X = np.array([[0.0 if "lunch" in ex.text else 1.0] for ex in context.pool_sample])
    pseudo = replace(context.pseudo, dev_X=dev_X, dev_y=y, pool_X=pool_X,
                     dev_ids=tuple(ex.id for ex in context.dev))
    monkeypatch.setattr(offline, "GUESS_HALVES_ROWS", len(y))  # the spam dev is small: halve it anyway
    fitted: list[np.ndarray] = []
    refit = pseudo.guess_from
    object.__setattr__(pseudo, "guess_from", lambda rows: fitted.append(np.asarray(rows)) or refit(rows))
    ctx = replace(context, pseudo=pseudo)
    proposer = OfflineProposer()
    proposals = proposer._guessed(proposer._workspace(ctx), ctx, 0.25, halved=True)
    first, second = halves(y)  # one refit per half, none on all of dev
    assert sorted(r.tolist() for r in fitted) == sorted([first.tolist(), second.tolist()])
    assert proposals
    for p in proposals:  # judged on exactly the half its classifier did not see
        assert any(np.array_equal(np.flatnonzero(p.held), np.setdiff1d(np.arange(len(y)), rows)) for rows in fitted)
    # a dev that is not the one the classifier was fitted on: the guesses are read whole, judged on all of dev
    other = replace(pseudo, dev_ids=("somewhere else",))
    whole = proposer._guessed(proposer._workspace(ctx), replace(ctx, pseudo=other), 0.25, halved=True)
    assert whole and all(p.held is None for p in whole)


def test_the_mining_workspace_follows_a_relabeled_row_with_the_same_id():
    """An expert labels a row into dev, takes it back and labels it again otherwise: the same ids, another class.
    The mining workspace was cached on the ids alone, so the agents went on mining the withdrawn label."""
    from dataclasses import replace

    task, dev = _spam_task(), _spam_dev()
    proposer = OfflineProposer()
    first = _context(task, dev)
    relabeled = replace(dev[0], label=1 - dev[0].label)
    second = _context(task, (relabeled, *dev[1:]))
    assert [ex.id for ex in first.dev] == [ex.id for ex in second.dev]
    assert proposer._workspace(first).y[0] == dev[0].label
    assert proposer._workspace(second).y[0] == relabeled.label
