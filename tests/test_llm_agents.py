"""The LLM proposer, its prompts and the mixed proposer, driven over HTTP by the scripted server."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from fake_openai_server import FakeOpenAIServer

from engine.agents.base import ExpertFeedback, ProposalContext
from engine.agents.choice import AGENT_CHOICES, make_proposer
from engine.agents.llm import prompts, spec_mode
from engine.agents.llm.proposer import LLMProposer, check_reply
from engine.agents.mixed import MixedProposer
from engine.agents.offline.proposer import OfflineProposer
from engine.domain import ABSTAIN, Annotator, AnnotatorScore, Candidate, Example, Task, code_hash
from engine.events import EventKind
from engine.llm.client import OpenAICompatibleClient
from engine.llm.config import LLMConfig
from engine.llm.costs import Budget
from engine.llm.seam import LLMAuthError, LLMCallFailed
from engine.metrics.score import score_annotator
from engine.sandbox.checks import ALLOWED_IMPORTS, check_source
from engine.sandbox.replies import extract_code
from engine.store.workspace import Store

TASK = Task("sms", ("ham", "spam"), {"ham": "a normal personal message", "spam": "unsolicited advertising"},
            "Is this text message spam?")
DEV_ROWS = [
    ("see you at lunch tomorrow", 0), ("call me when you get home", 0), ("thanks for the lovely dinner", 0),
    ("are we still meeting, call me", 0), ("happy birthday my friend", 0), ("the meeting moved to friday", 0),
    ("win a free prize now, text WIN to 80080", 1), ("you have won a cash prize, call now", 1),
    ("free entry in our weekly prize draw", 1), ("urgent: claim your free ringtone", 1),
    ("congratulations you won a free cruise", 1), ("txt STOP to end free offers", 1),
]
DEV = tuple(Example(f"d{i}", text, "dev", label) for i, (text, label) in enumerate(DEV_ROWS))
MEETING = '''def annotate(example):
    """Mentions a meeting."""
    return "ham" if "meeting" in example["text"].lower() else None
'''
CALL = '''import re

CALL = re.compile(r"\\bcall\\b")


def annotate(example):
    """Asks to call."""
    return "spam" if CALL.search(example["text"].lower()) else None
'''
FREE = '''def annotate(example):
    """Offers something free."""
    return "spam" if "free" in example["text"].lower() else None
'''
MEETUP = '''def annotate(example):
    """Plans to meet."""
    text = example["text"].lower()
    return "ham" if any(w in text for w in ("meeting", "lunch", "dinner", "meet")) else None
'''
IMPORT_OS = '''import os

def annotate(example):
    return "spam" if os.getenv("SPAM") else None
'''


def fenced(*sources: str, prose: str = "Here you go.") -> str:
    return "\n\n".join(f"{prose}\n```python\n{s}```" for s in sources)


def run_annotator(source: str, examples: tuple[Example, ...], labels: tuple[str, ...]) -> np.ndarray:
    """In-process votes of checked, test-authored code (the real runs go through the sandbox)."""
    namespace: dict = {}
    exec(compile(check_source(source), "<annotator>", "exec"), namespace)  # noqa: S102 - our own test code
    out = [namespace["annotate"](ex.as_input()) for ex in examples]
    return np.array([labels.index(v) if v is not None else ABSTAIN for v in out], dtype=np.int64)


def context_for(sources: list[str], generation: int = 1, seed: int = 0, agent: str = "generator",
                dev: tuple[Example, ...] = DEV, pool_sample: tuple[Example, ...] = ()) -> ProposalContext:
    """The context a generation would see with `sources` as its pool (scores computed on dev)."""
    annotators, columns, scores = [], [], {}
    y = np.array([ex.label for ex in dev])
    for source in sources:
        normalised = check_source(source)
        a = Annotator(code_hash(normalised), source.split('"""')[1], normalised, agent, generation - 1)
        votes = run_annotator(source, dev, TASK.labels)
        annotators.append(a)
        columns.append(votes)
        scores[a.id] = score_annotator(a.id, votes, y)
    dev_votes = np.stack(columns, axis=1) if columns else np.empty((len(dev), 0), dtype=np.int64)
    return ProposalContext(TASK, dev, pool_sample, tuple(annotators), scores, dev_votes, generation, seed)


@pytest.fixture
def server(fake_openai):
    return fake_openai


def client_for(server: FakeOpenAIServer, store: Store | None = None, budget: Budget | None = None,
               **settings) -> OpenAICompatibleClient:
    config = LLMConfig(base_url=server.base_url, api_key="sk-agents-test", timeout_s=2.0, max_retries=1,
                       **settings)
    return OpenAICompatibleClient(config, store=store, budget=budget)


# ---- parsing replies ---------------------------------------------------------------------------
def test_check_reply_keeps_every_good_block_and_names_each_bad_one():
    reply = ("First, a cue word:\n```python\n" + FREE + "```\nNow one that reads files:\n```py\n" + IMPORT_OS
             + "```\n```text\nnot code\n```")
    good, errors = check_reply(reply)
    assert good == [("First, a cue word:", check_source(FREE))]
    assert errors == ["block 2: imports 'os', which is not allowed (allowed: " + ", ".join(sorted(ALLOWED_IMPORTS))
                      + ")"]
    assert check_reply("I would rather not.") == ([], ["no code block found"])


def test_reply_check_and_extractor_agree_on_an_unclosed_fence():
    """A complete annotator whose closing fence never came is accepted (as `extract_code` accepts it); a cut-off
    is blamed only when the reply really hit max_tokens."""
    unclosed = "Here:\n```python\n" + FREE
    good, errors = check_reply(unclosed)
    assert (good, errors) == ([("Here:", check_source(FREE))], [])
    assert check_source(extract_code(unclosed)) == good[0][1]
    broken = "```python\ndef annotate(example):\n    return ("
    assert "cut off" not in check_reply(broken)[1][0]
    assert "max_tokens" in check_reply(broken, cut_off=True)[1][0]
    assert check_reply(FREE)[0][0][1] == check_source(FREE)  # bare code without a fence is accepted


def test_an_example_block_or_a_self_test_beside_the_annotator_is_not_an_annotator_to_repair():
    """A python-tagged `print(annotate(...))` block after the code, or an `if __name__ == "__main__":` self-test in
    it, was checked as an annotator: the first cost a repair call per reply, the second sank the annotator (a review
    against small local models)."""
    usage = "Example usage:\n```python\nprint(annotate({'text': 'free prize'}))\n```\n"
    good, errors = check_reply(fenced(FREE) + usage)
    assert good == [("Here you go.", check_source(FREE))] and errors == []
    tested = FREE + "\n\nif __name__ == '__main__':\n    print(annotate({'text': 'free'}))\n"
    good, errors = check_reply(fenced(tested))
    assert good == [("Here you go.", check_source(FREE))] and errors == []
    # a reply of examples only is still told it has no annotator
    assert check_reply(usage)[1] and not check_reply(usage)[0]


# ---- prompts -----------------------------------------------------------------------------------
def test_every_role_states_the_contract_and_quotes_no_holdout():
    pool = context_for([MEETING, CALL], generation=2)
    rng = np.random.default_rng(0)
    refiner_target = pool.annotators[0]
    built = {"generator": prompts.generator_messages(context_for([]), rng, 2),
             "improver": prompts.improver_messages(pool, rng, 2),
             "refiner": prompts.refiner_messages(pool, refiner_target, rng, 2)}
    for role, messages in built.items():
        text = "\n".join(m["content"] for m in messages)
        assert "def annotate(example: dict) -> str | None" in text, role
        assert '"ham", "spam"' in text and "or None to abstain" in text, role
        assert all(module in text for module in ALLOWED_IMPORTS), role
        assert "```python" in text and "No I/O" in text, role
        assert "Is this text message spam?" in text and "unsolicited advertising" in text, role
    assert "Write 2 new annotators" in built["generator"][1]["content"]
    assert MEETING.split("\n")[0] in built["refiner"][1]["content"]
    assert "multi-label" not in text
    multi = dataclasses.replace(TASK, multi_label=True)
    assert "The task is multi-label" in prompts.annotator_contract(multi)


def test_holdout_rows_are_refused():
    leaked = DEV + (Example("t0", "a holdout row", "test", 1),)
    with pytest.raises(ValueError, match="holdout"):
        prompts.generator_messages(context_for([], dev=leaked), np.random.default_rng(0), 1)
    labeled_pool = (Example("p0", "a pool row", "pool", 1),)
    with pytest.raises(ValueError, match="unlabeled pool sample"):
        prompts.improver_messages(context_for([], pool_sample=labeled_pool), np.random.default_rng(0), 1)


def test_examples_are_seeded_and_cover_each_class():
    context = context_for([])
    first = prompts.examples_per_class(context, np.random.default_rng(5), per_class=2)
    again = prompts.examples_per_class(context, np.random.default_rng(5), per_class=2)
    assert first == again and [ex.label for ex in first] == [0, 0, 1, 1]
    assert prompts.render_example(DEV[6], TASK) == '{"text": "win a free prize now, text WIN to 80080"} -> "spam"'


def test_prompts_stay_bounded_with_300_labels_and_huge_annotators():
    """Past 36 labels the generator and the improver quote 36 dev rows, of the classes the pool does worst on, and
    every prompt quotes at most prompts.SOURCE_CHARS of annotator source (an annotator may be 100,000 characters)."""
    k = 300
    task = Task("topics", tuple(f"topic_{c}" for c in range(k)))
    dev = tuple(Example(f"d{c}-{j}", f"row {j} about subject{c} " + "filler " * 40, "dev", c)
                for c in range(k) for j in range(2))
    y = np.array([ex.label for ex in dev])
    votes = np.where((y >= 250) & (y < 286), ABSTAIN, y)  # classes 250-285 are the ones nobody votes
    huge = Annotator("big", "big", FREE + "# a long comment line\n" * 5000, "generator", 0)
    edits = tuple((huge, dataclasses.replace(huge, id=f"edit{i}"), "broaden it") for i in range(5))
    context = ProposalContext(task, dev, (), (huge,), {"big": score_annotator("big", votes, y)}, votes[:, None], 2,
                              0, feedback=ExpertFeedback(edits=edits))
    rng = np.random.default_rng(0)
    shown = prompts.examples_per_class(context, rng)
    assert sorted(ex.label for ex in shown) == list(range(250, 286))
    for messages in (prompts.generator_messages(context, rng, 2), prompts.improver_messages(context, rng, 2),
                     prompts.refiner_messages(context, huge, rng, 2)):
        user = messages[1]["content"]
        assert len(user) < 30_000 and user.count(" -> ") <= 36
        assert "more characters of this annotator not shown" in user


def test_past_the_listed_labels_the_improver_names_and_aims_at_the_weakest_it_lists():
    """One order of "weakest" (lowest dev F1, then least covered): with 40 labels all at F1 0, the 36 the prompt lists,
    the weak labels it asks to fix and the label the first spec call aims at are the uncovered ones first."""
    k = 40
    task = Task("topics", tuple(f"topic_{c}" for c in range(k)))
    dev = tuple(Example(f"d{c}-{j}", f"row {j} about subject{c}", "dev", c) for c in range(k) for j in range(2))
    y = np.array([ex.label for ex in dev])
    votes = np.where(y < 30, (y + 1) % 30, ABSTAIN)  # topics 0-29 always voted wrong, 30-39 never voted on
    member = Annotator("wrong", "wrong", FREE, "generator", 0)
    context = ProposalContext(task, dev, (), (member,), {"wrong": score_annotator("wrong", votes, y)},
                              votes[:, None], 2, 0)
    order = prompts.weakest_classes(context)
    assert order[:10] == list(range(30, 40)) and order[10:] == list(range(30))
    user = prompts.improver_messages(context, np.random.default_rng(0), 2)[1]["content"]
    listed = {line.split('"')[1] for line in user.splitlines() if line.startswith('- "')}
    named = set(json.loads("[" + user.split("fix the weak labels (")[1].split(")")[0] + "]"))
    assert len(listed) == 36 and named == listed == {task.labels[c] for c in order[:36]}
    assert LLMProposer._spec_label("improver", 0, None, context) == "topic_30"


def test_improver_sees_weak_classes_and_word_clusters():
    # MEETING fires on rows 3, 5 (ham); CALL on rows 1, 3, 7 (spam). Majority vote: 1->spam, 3->ham (tie goes
    # to the lower id), 5->ham, 7->spam. ham F1 = 2*2/(2+6) = 0.50; spam F1 = 2*1/(2+6) = 0.25 (weak).
    context = context_for([MEETING, CALL], generation=2)
    assert prompts.dev_class_f1(context) == pytest.approx([0.5, 0.25])
    uncovered = context.uncovered_dev()
    assert list(uncovered) == [0, 2, 4, 6, 8, 9, 10, 11]
    # "free" is in 5 of the 8 uncovered rows and 5 of 12 dev rows: ratio (5/8)/(6/13) > 1; "prize" is in 2 of 8
    # uncovered but 3 of 12 overall: (2/8)/(4/13) < 1; nothing else is shared by two uncovered rows.
    assert prompts.word_clusters(context, uncovered) == [prompts.WordCluster(("free",), (6, 8, 9, 10, 11))]
    text = prompts.improver_messages(context, np.random.default_rng(0), 2)[1]["content"]
    assert '"spam": 0.25 (weak), 6 dev rows (few)' in text and '"ham": 0.50, 6 dev rows (few)\n' in text
    assert 'Labels with few dev rows ("ham", "spam") are too rare in dev' in text
    assert "group sharing free (5 rows; gold: spam x5)" in text
    assert 'fix the weak labels ("spam")' in text


def test_the_improver_points_the_llm_at_the_meaning_of_labels_with_few_dev_rows_only():
    plenty = tuple(Example(f"d{copy}-{i}", text, "dev", label) for copy in range(4)
                   for i, (text, label) in enumerate(DEV_ROWS))  # 24 rows of each label
    text = prompts.improver_messages(context_for([MEETING, CALL], generation=2, dev=plenty),
                                     np.random.default_rng(0), 2)[1]["content"]
    assert ", 24 dev rows\n" in text and "(few)" not in text and "Labels with few dev rows" not in text
    few = context_for([MEETING, CALL], generation=2)  # 6 rows of each label
    aimed = prompts.improver_messages(few, np.random.default_rng(0), 2, mode="spec", label="spam",
                                      words=("free",))[1]["content"]
    assert "(few)" in aimed and "Labels with few dev rows" not in aimed  # a call aimed at one label asks for it only
    sets = np.eye(2, dtype=np.int64)[few.dev_labels]
    sets[np.flatnonzero(few.dev_labels == 0)[:3], 1] = 1  # a multi-label dev: spam in 9 rows' sets, first in 6
    multi = dataclasses.replace(few, dev_label_sets=sets)
    lines = prompts.improver_messages(multi, np.random.default_rng(0), 2)[1]["content"].splitlines()
    assert ", 9 dev rows (few)" in next(x for x in lines if x.startswith('- "spam"'))


def test_refiner_targets_are_precise_but_narrow():
    proposer = LLMProposer(client=None, n_per_role=2)  # type: ignore[arg-type]  # no calls made here
    base = context_for([])
    members = [Annotator(f"a{i}", f"a{i}", FREE, "generator", 1) for i in range(4)]
    scores = {"a0": AnnotatorScore("a0", 3, 0.05, 0.90, 1, 3), "a1": AnnotatorScore("a1", 3, 0.05, 0.50, 1, 2),
              "a2": AnnotatorScore("a2", 9, 0.20, 0.80, 1, 7), "a3": AnnotatorScore("a3", 1, 0.02, 0.60, 1, 1)}
    context = ProposalContext(TASK, base.dev, (), tuple(members), scores, np.full((12, 4), ABSTAIN), 2, 0)
    assert [a.id for a in proposer.refine_targets(context)] == ["a0", "a3"]
    assert [a.id for a in LLMProposer(None, max_refine=1).refine_targets(context)] == ["a0"]  # type: ignore


# ---- the proposer over HTTP --------------------------------------------------------------------
def test_two_generations_of_llm_written_annotators(server):
    events: list[tuple[str, dict]] = []
    proposer = LLMProposer(client_for(server), n_per_role=1, per_call=2, refine_max_coverage=0.2,
                           on_event=lambda kind, payload: events.append((kind, payload)))
    # generation 1: an empty pool, only the generator has work
    server.reply(fenced(MEETING, CALL, prose="A meeting cue, then a call cue."))
    first = proposer.propose("generator", context_for([]))
    assert [c.source for c in first] == [check_source(MEETING), check_source(CALL)]
    assert {c.agent for c in first} == {"generator"} and first[0].rationale == "A meeting cue, then a call cue."
    assert proposer.propose("refiner", context_for([])) == [] and len(server.requests) == 1  # nothing to refine

    # generation 2: the pool is what generation 1 proposed, scored on dev
    context = context_for([MEETING, CALL], generation=2)
    server.reply(fenced(FREE))
    improved = proposer.propose("improver", context)
    assert [c.source for c in improved] == [check_source(FREE)]
    assert '"spam": 0.25 (weak)' in server.requests[-1].last_user_message
    server.reply(fenced(MEETUP))
    refined = proposer.propose("refiner", context)  # MEETING: precision 1.0, coverage 2/12 <= 0.2
    meeting_id = code_hash(check_source(MEETING))
    assert [(c.source, c.parent_ids, c.agent) for c in refined] == [(check_source(MEETUP), (meeting_id,), "refiner")]
    assert "precision 1.00" in server.requests[-1].last_user_message
    assert [kind for kind, _ in events].count("llm_call") == 3 and proposer.last_dropped == []
    assert len({r.body["seed"] for r in server.requests}) == 3  # each call is its own sample


def test_reply_without_code_gets_one_repair_then_is_dropped(server):
    events: list[tuple[str, dict]] = []
    server.reply("I think spam messages often mention prizes.")
    server.reply("Sorry, still no code.")
    proposer = LLMProposer(client_for(server), n_per_role=1, on_event=lambda k, p: events.append((k, p)))
    assert proposer.propose("generator", context_for([])) == []
    assert len(server.requests) == 2
    repair = server.requests[1].body["messages"]
    assert repair[-2] == {"role": "assistant", "content": "I think spam messages often mention prizes."}
    assert "- no code block found" in repair[-1]["content"]
    assert proposer.last_dropped == [("generator", "rejected after one repair: no code block found")]
    assert ("llm_repair", {"agent": "generator", "call": 0, "errors": ["no code block found"]}) in events
    assert ("candidate_dropped", {"agent": "generator", "name": "",
                                  "reason": "rejected after one repair: no code block found"}) in events


def test_disallowed_import_is_repaired_or_dropped_with_reason(server):
    server.reply(fenced(IMPORT_OS))
    server.reply(fenced(IMPORT_OS))
    proposer = LLMProposer(client_for(server), n_per_role=1)
    assert proposer.propose("generator", context_for([])) == []
    assert "imports 'os', which is not allowed" in server.requests[1].last_user_message
    ((role, reason),) = proposer.last_dropped
    assert role == "generator" and reason.startswith("rejected after one repair: imports 'os'")
    # a repair that works keeps the fixed annotator
    server.reply(fenced(IMPORT_OS))
    server.reply(fenced(FREE))
    fixed = LLMProposer(client_for(server), n_per_role=1).propose("generator", context_for([], seed=1))
    assert [c.source for c in fixed] == [check_source(FREE)]


def test_budget_running_out_mid_generation_stops_cleanly(server):
    for source in (FREE, MEETING, CALL):
        server.reply(fenced(source))
    proposer = LLMProposer(client_for(server, budget=Budget(max_calls=2)), n_per_role=3, parallel=1)
    got = proposer.propose("generator", context_for([]))
    assert [c.source for c in got] == [check_source(FREE), check_source(MEETING)]
    assert proposer.budget_exhausted and len(server.requests) == 2 and server.pending == 1
    assert proposer.propose("improver", context_for([MEETING], generation=2)) == []
    assert len(server.requests) == 2


def test_budget_running_out_before_a_repair_drops_with_reason(server):
    server.reply(fenced(FREE, IMPORT_OS))
    proposer = LLMProposer(client_for(server, budget=Budget(max_calls=1)), n_per_role=1)
    assert [c.source for c in proposer.propose("generator", context_for([]))] == [check_source(FREE)]
    ((_, reason),) = proposer.last_dropped
    assert reason.startswith("rejected, not repaired (budget exhausted): block 2: imports 'os'")
    assert proposer.budget_exhausted and len(server.requests) == 1


def test_rerun_with_the_same_seed_is_answered_from_the_store(server, store):
    server.reply(fenced(MEETING, CALL))
    server.reply(fenced(FREE))
    first_ctx, second_ctx = context_for([]), context_for([MEETING, CALL], generation=2)
    first = LLMProposer(client_for(server, store), n_per_role=1)
    before = first.propose("generator", first_ctx) + first.propose("improver", second_ctx)
    assert len(server.requests) == 2
    rerun = LLMProposer(client_for(server, store), n_per_role=1)
    after = rerun.propose("generator", first_ctx) + rerun.propose("improver", second_ctx)
    assert after == before and len(server.requests) == 2  # zero requests the second time
    assert len(store.llm_calls()) == 2


def test_refused_key_propagates_as_auth_error(server):
    server.fail(401)
    with pytest.raises(LLMAuthError, match=r"refused the API key \(401\)"):
        LLMProposer(client_for(server), n_per_role=2, parallel=1).propose("generator", context_for([]))
    assert len(server.requests) == 1


def test_an_unreachable_endpoint_is_an_error_not_silence(server):
    for _ in range(4):
        server.fail(500)
    with pytest.raises(LLMCallFailed, match="failed after 2 attempts"):
        LLMProposer(client_for(server), n_per_role=2, parallel=1).propose("generator", context_for([]))
    # one failed call among good ones is only dropped
    server.fail(500)
    server.fail(500)
    server.reply(fenced(FREE))
    proposer = LLMProposer(client_for(server), n_per_role=2, parallel=1)
    assert [c.source for c in proposer.propose("generator", context_for([], seed=3))] == [check_source(FREE)]
    assert proposer.last_dropped[0][1].startswith("LLM call failed")


def test_known_and_excluded_annotators_are_not_proposed_again(server):
    context = context_for([MEETING], generation=2)
    excluded = code_hash(check_source(CALL))
    context = ProposalContext(context.task, context.dev, (), context.annotators, context.scores,
                              context.dev_votes, 2, 0, frozenset({excluded}))
    server.reply(fenced(MEETING, CALL, FREE, FREE))
    proposer = LLMProposer(client_for(server), n_per_role=1)
    assert [c.source for c in proposer.propose("improver", context)] == [check_source(FREE)]
    assert [reason for _, reason in proposer.last_dropped] == [
        "duplicate of an annotator already in the pool, proposed or rejected"] * 3


def test_parallel_calls_return_every_candidate(server):
    for source in (FREE, MEETING, CALL):
        server.reply(fenced(source))
    proposer = LLMProposer(client_for(server, max_parallel=3), n_per_role=3)
    assert proposer.parallel == 3
    got = proposer.propose("generator", context_for([]))
    assert sorted(c.source for c in got) == sorted(check_source(s) for s in (FREE, MEETING, CALL))


def test_mixed_proposer_concatenates_in_order(server):
    class Fixed:
        name = "fixed"

        def __init__(self) -> None:
            self.last_dropped = [("generator", "fixed reason")]

        def propose(self, role: str, context: ProposalContext) -> list[Candidate]:
            return [Candidate(source=MEETUP, agent=role)]

    server.reply(fenced(FREE))
    mixed = MixedProposer(LLMProposer(client_for(server), n_per_role=1), Fixed())
    got = mixed.propose("generator", context_for([]))
    assert mixed.name == "mixed" and [c.source for c in got] == [check_source(FREE), MEETUP]
    assert mixed.last_dropped == [("generator", "fixed reason")] and not mixed.budget_exhausted
    with pytest.raises(ValueError):
        MixedProposer()


# ---- through the real generation loop ----------------------------------------------------------
def test_two_generations_through_evolve(server, store):
    evolve = pytest.importorskip("engine.evolve", reason="engine.evolve (with gate and sandbox) not available")
    from engine.gate import GateConfig
    from engine.sandbox.executor import SandboxExecutor

    holdout = [("HOLDOUT free tickets now", 1), ("HOLDOUT see you soon", 0)]
    pool = ["free gift card inside", "lunch at one?", "call the office"]
    frame = pd.DataFrame({
        "id": [f"d{i}" for i in range(len(DEV_ROWS))] + ["t0", "t1"] + [f"p{i}" for i in range(len(pool))],
        "text": [t for t, _ in DEV_ROWS] + [t for t, _ in holdout] + pool,
        "fields": [{} for _ in range(len(DEV_ROWS) + len(holdout) + len(pool))],
        "split": ["dev"] * len(DEV_ROWS) + ["test"] * len(holdout) + ["pool"] * len(pool),
        "label": [y for _, y in DEV_ROWS] + [y for _, y in holdout] + [None] * len(pool),
    })
    store.save_task(TASK)
    store.add_examples("tiny", "test", frame)
    for generator_reply, improver_reply in ((fenced(FREE, MEETUP), fenced(CALL)), (fenced(FREE), fenced(MEETING))):
        server.reply(generator_reply, when="Labeled examples from the dev split")
        server.reply(improver_reply, when="Dev F1 of its majority vote")
    events: list[tuple[str, dict]] = []

    def sink(kind: str, payload: dict) -> None:
        events.append((kind, payload))

    proposer = LLMProposer(client_for(server, store), n_per_role=1, on_event=sink)  # one sink for both
    config = evolve.EvolveConfig(gate=GateConfig(min_fires=2), roles=("generator", "improver"))
    with SandboxExecutor(workers=1) as executor:
        done = [evolve.run_generation(store, proposer, executor, n, config, sink) for n in (1, 2)]
    assert [g.number for g in done] == [1, 2]
    accepted_first = {d.annotator_id for d in done[0].decisions if d.verdict == "accept"}
    assert {code_hash(check_source(FREE)), code_hash(check_source(MEETUP))} <= accepted_first
    assert done[0].dev_macro_f1_after > done[0].dev_macro_f1_before
    assert "The pool has 0 annotators" in server.requests[1].last_user_message
    assert f"The pool has {len(done[0].pool_ids)} annotators" in server.requests[3].last_user_message
    assert all("HOLDOUT" not in str(r.body) for r in server.requests)
    assert len(server.requests) == 4 and server.pending == 0  # per generation: one generator, one improver call
    assert ("candidate_dropped", {"agent": "generator", "name": "",
                                  "reason": "duplicate of an annotator already in the pool, proposed or rejected"}
            ) in events  # generation 2's generator repeated FREE
    assert store.last_complete_generation() == 2 and len(store.llm_calls()) == 4


# ---- choosing the agents ------------------------------------------------------------------------
def test_make_proposer_builds_each_choice_and_refuses_others(server, store):
    assert isinstance(make_proposer("offline"), OfflineProposer)
    server.reply(fenced(FREE))
    events: list[EventKind] = []
    mixed = make_proposer("mixed", store, llm_overrides={"base_url": server.base_url, "model": ""},
                          budget=Budget(max_calls=1), on_event=lambda kind, payload: events.append(kind))
    llm, offline = mixed.proposers
    assert isinstance(llm, LLMProposer) and isinstance(offline, OfflineProposer)
    llm.n_per_role = 1
    assert [c.source for c in llm.propose("generator", context_for([]))] == [check_source(FREE)]
    assert EventKind.LLM_CALL in events and len(store.llm_calls()) == 1  # the CLI's sink, the studio's store
    assert set(AGENT_CHOICES) == {"offline", "llm", "mixed"}
    with pytest.raises(ValueError, match="agents must be one of"):
        make_proposer("oracle")


def test_a_failed_repair_keeps_the_good_code_of_the_first_reply(server):
    server.reply(fenced(FREE, IMPORT_OS))  # one good block, one rejected: a repair goes out, and fails
    server.fail(503)
    server.fail(503)
    proposer = LLMProposer(client_for(server), n_per_role=1, parallel=1)
    assert [c.source for c in proposer.propose("generator", context_for([]))] == [check_source(FREE)]  # raised
    assert proposer.last_dropped[0][1].startswith("rejected, repair call failed: block 2: imports 'os'")


def test_an_untagged_example_after_the_code_is_prose_not_a_block_to_repair(server):
    reply = (fenced(FREE) + "\nExample:\n```\n>>> annotate({'text': 'free prize'})\n'SPAM'\n```\n"
             "Output:\n```\nSPAM\n```\n")
    good, errors = check_reply(reply)
    assert good == [("Here you go.", check_source(FREE))] and errors == []
    server.reply(reply)
    proposer = LLMProposer(client_for(server), n_per_role=1, parallel=1)
    assert [c.source for c in proposer.propose("generator", context_for([]))] == [check_source(FREE)]
    assert len(server.requests) == 1  # no paid repair call for it


@pytest.mark.parametrize("mode", ["code", "spec"])
def test_the_system_message_names_each_label_once_when_there_are_many(mode):
    many = Task("intents", tuple(f"intent_{i:03d}" for i in range(300)), {}, "")
    content = prompts.system_message(many, mode)["content"]
    assert all(content.count(json.dumps(label)) == 1 for label in many.labels)
    assert "the 300 label names listed under Labels above" in content
    few = Task("sms", ("HAM", "SPAM"), {}, "")
    assert prompts.system_message(few, mode)["content"].count('"SPAM"') == 2  # few: the contract quotes them too


def test_a_reply_cut_off_while_thinking_or_with_only_reasoning_gets_the_right_advice(server):
    """"Write shorter code" was the advice for a reply cut off inside <think>, before any code, and a reply whose
    answer was empty beside the model's reasoning (reasoning_content) said only "no code block found"."""
    thinking = "<think>The label SPAM means ... let me list cue words: free, win, prize, and"
    (error,) = check_reply(thinking, cut_off=True)[1]
    assert "still thinking" in error and "EVOPOOL_MAX_TOKENS" in error and "shorter code" not in error
    server.raw(200, json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": None,
                                 "reasoning_content": "Let me think: " + FREE}}]}),
        "application/json")
    reply = client_for(server).complete([{"role": "user", "content": "Write one."}], role="generator")
    assert reply.reasoning_only and reply.text == ""
    (error,) = check_reply(reply.text, reasoning_only=reply.reasoning_only)[1]
    assert "only the model's reasoning" in error
    (error,) = check_reply("", cut_off=True, reasoning_only=True)[1]  # reasoning cut off by the limit
    assert "only the model's reasoning" in error and "shorter code" not in error
    # spec mode says the same, not "give fewer objects"
    task = Task("spam", ("HAM", "SPAM"), {}, "")
    (error,) = spec_mode.parse_specs(thinking, task, cut_off=True)[1]
    assert "still thinking" in error and "fewer objects" not in error
    assert "only the model's reasoning" in spec_mode.parse_specs("", task, reasoning_only=True)[1][0]
