"""The expert's judgement reaches the agents: a rejected idea is not proposed again in any wording, the LLM prompt
quotes the reason, edits and the rows the expert aimed at; and the store's verdicts become that feedback."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from test_offline_agents import HAM, SPAM  # the same toy SMS rows

from engine.agents.base import ExpertFeedback, ProposalContext
from engine.agents.feedback import repeats_rejected
from engine.agents.llm.prompts import expert_feedback_text, generator_messages, improver_messages
from engine.agents.offline.proposer import OfflineProposer
from engine.domain import AUDIT, Example, Task
from engine.evolve import EvolveConfig, build_context, evolve, expert_feedback
from engine.expert import review
from engine.ingest.importer import IngestOptions, import_path
from engine.sandbox.annotators import make_annotator
from engine.sandbox.executor import SandboxExecutor
from engine.specs.templates import AnnotatorSpec, parse_spec
from engine.store.workspace import Store


def _context() -> ProposalContext:
    dev = tuple(Example(f"s{i}{w}", f"{t} {w}", "dev", 1) for i, t in enumerate(SPAM) for w in ("", "x", "!!"))
    dev += tuple(Example(f"h{i}{w}", f"{t} {w}", "dev", 0) for i, t in enumerate(HAM) for w in ("", "x", "!!"))
    pool = tuple(Example(f"p{i}", ex.text, "pool") for i, ex in enumerate(dev))
    return ProposalContext(task=Task(name="sms", labels=("ham", "spam")), dev=dev, pool_sample=pool,
                           annotators=(), scores={}, dev_votes=np.zeros((len(dev), 0), dtype=np.int64),
                           generation=1, seed=0)


def test_the_same_idea_in_other_words_is_recognised():
    old = AnnotatorSpec("cue", "spam", "sentence", ("free", "win", "prize"))
    assert repeats_rejected(AnnotatorSpec("cue", "spam", "sentence", ("free", "win", "cash")), [old])  # 2/4
    assert not repeats_rejected(AnnotatorSpec("cue", "spam", "sentence", ("call", "txt")), [old])
    assert not repeats_rejected(AnnotatorSpec("cue", "ham", "sentence", ("free", "win", "prize")), [old])


def test_a_rejected_offline_idea_is_not_proposed_again():
    context = _context()
    first = OfflineProposer().propose("generator", context)
    rejected = make_annotator(first[0], 1)
    spec = parse_spec(rejected.source)
    assert spec is not None
    feedback = ExpertFeedback(rejected=((rejected, "fires on song titles"),))
    again = OfflineProposer().propose("generator", replace(context, feedback=feedback))
    specs = [parse_spec(c.source) for c in again]
    assert again and not any(s is not None and repeats_rejected(s, [spec]) for s in specs)
    # without the feedback the same idea (or a near copy) would come back first
    assert repeats_rejected(parse_spec(OfflineProposer().propose("generator", context)[0].source), [spec])


def test_the_llm_prompt_quotes_the_expert():
    context = _context()
    first = OfflineProposer().propose("generator", context)
    rejected, approved = make_annotator(first[0], 1), make_annotator(first[1], 1)
    aimed = (Example("p1", "claim your free holiday", "pool"),)
    feedback = ExpertFeedback(rejected=((rejected, "fires on song titles"),), approved=((approved, "precise"),),
                              focus_terms=("holiday", "claim"), focus_examples=aimed)
    rng = np.random.default_rng(0)
    for messages in (generator_messages(replace(context, feedback=feedback), rng, 2),
                     improver_messages(replace(context, feedback=feedback), rng, 2)):
        user = messages[-1]["content"]
        assert f"REJECTED {rejected.name!r} because: fires on song titles" in user
        assert f"approved {approved.name!r} (precise)" in user
        assert "claim your free holiday" in user and "holiday, claim" in user
    assert "REJECTED" not in generator_messages(context, rng, 2)[-1]["content"]


def test_the_store_gives_the_agents_the_experts_verdicts_edits_and_aim(store, demo_csv):
    import_path(store, demo_csv, IngestOptions(audit_fraction=0.5))
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 1)
        pool = store.pool_ids()
        review.reject(store, pool[0], "too broad")
        parent = store.annotator(pool[1])
        edited = review.save_edit(store, executor, parent.source.replace('"""', '"""Edited. ', 1), parent.id,
                                  "narrowed to links")
    audit_ids = store.example_ids(AUDIT)
    pool_ids = store.example_ids("pool")[:3]
    store.set_meta("focus", {"terms": ["subscribe"], "split": "pool", "example_ids": pool_ids})
    feedback = expert_feedback(store)
    assert [(a.id, note) for a, note in feedback.rejected] == [(pool[0], "too broad")]
    assert [(b.id, a.id) for b, a, _ in feedback.edits] == [(parent.id, edited.id)]
    assert [ex.id for ex in feedback.focus_examples] == pool_ids
    assert all(ex.label is None for ex in feedback.focus_examples)
    # a focus on dev rows never hands the agents an audit row
    store.set_meta("focus", {"terms": ["x"], "split": "dev", "example_ids": audit_ids[:3]})
    assert expert_feedback(store).focus_examples == ()
    assert build_context(store, 2, EvolveConfig()).feedback.rejected


def test_every_rejection_reaches_the_agents_and_a_prompt_quotes_the_last_few(tmp_path, demo_csv):
    """Past 20 rejections the older ones were forgotten, and the offline agents proposed their ideas again."""
    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv, IngestOptions())
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, 2)
    members = [a.id for a in store.annotators()]  # every one proposed: the pool alone may hold fewer than 21
    assert len(members) > 20
    for member in members:
        review.reject(store, member, "not what I mean by spam")
    feedback = expert_feedback(store)
    assert {a.id for a, _ in feedback.rejected} == set(members)
    text = expert_feedback_text(build_context(store, 3, EvolveConfig()))
    assert text.count("REJECTED") == 5
