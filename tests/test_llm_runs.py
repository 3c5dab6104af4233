"""The LLM agents in whole runs against the scripted server: honest budgets, degrading mixed runs, provenance,
the usage summary, structured (spec) mode, cut-off replies and adapting to a one-request-at-a-time server.
Each test is one defect found against a real llama.cpp server (issue 17)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from fake_openai_server import FakeOpenAIServer
from test_llm_agents import FREE, context_for, fenced

from engine.agents.base import ProposalContext
from engine.agents.llm.proposer import LLMProposer
from engine.agents.llm.spec_mode import parse_specs
from engine.domain import Example, Task
from engine.events import EventKind
from engine.llm.client import OpenAICompatibleClient
from engine.llm.config import LLMConfig
from engine.llm.costs import Budget, BudgetExhausted
from engine.sandbox.checks import check_source
from engine.specs.templates import AnnotatorSpec, render
from engine.store.workspace import Store

ROOT = Path(__file__).resolve().parents[1]
SPAM_CODE = '''import re

LINK = re.compile(r"http|subscribe|check out|channel")


def annotate(example):
    """Links and self-promotion."""
    return "SPAM" if LINK.search(example["text"].lower()) else None
'''


def client_for(server: FakeOpenAIServer, store: Store | None = None, budget: Budget | None = None,
               **settings) -> OpenAICompatibleClient:
    config = LLMConfig(base_url=server.base_url, model="tiny-local", **{"timeout_s": 5.0, "max_retries": 1,
                                                                         **settings})
    return OpenAICompatibleClient(config, store=store, budget=budget)


def evopool(*args: str, **env: str) -> tuple[dict | None, subprocess.CompletedProcess]:
    out = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None), out


@pytest.fixture
def demo_ws(tmp_path: Path, demo_csv: Path) -> str:
    """A workspace holding the bundled demo and no generation yet."""
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    return ws


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- honest budgets ---------------------------------------------------------------------------------
def test_every_attempt_counts_against_the_call_limit(fake_openai, store):
    for _ in range(5):
        fake_openai.fail(503)
    budget = Budget(max_calls=3)
    client = client_for(fake_openai, store, budget, max_retries=4)
    with pytest.raises(BudgetExhausted, match="--max-calls"):
        client.complete([{"role": "user", "content": "hi"}], role="generator")
    assert len(fake_openai.requests) == 3 and budget.calls == 3  # the fourth attempt was never sent
    assert store.llm_spent()["calls"] == 3 and client.usage.as_dict()["failures"] == {"HTTP 503": 3}


def test_limits_belong_to_the_workspace_and_name_the_limit_hit(fake_openai, store):
    fake_openai.reply("one")
    fake_openai.reply("two")
    client = client_for(fake_openai, store, Budget.for_workspace(store, max_calls=2))
    for _ in range(2):
        client.complete([{"role": "user", "content": f"q{_}"}], role="generator")
    again = Budget.for_workspace(store)  # a later run without the flag: same limit, same spending
    assert again.max_calls == 2 and again.calls == 2
    with pytest.raises(BudgetExhausted, match=r"2 of 2 calls used \(the call limit, --max-calls\)"):
        again.reserve_call()
    raised = Budget.for_workspace(store, max_calls=5)
    assert raised.summary()["remaining"]["calls"] == 3 and raised.summary()["this_run"]["calls"] == 0
    assert Budget.for_workspace(store, max_calls=-1).max_calls is None


def test_a_starved_generation_is_not_complete_and_the_next_run_continues_it(fake_openai, demo_ws):
    flags = ("--workdir", demo_ws, "--agents", "llm", "--base-url", fake_openai.base_url, "--model", "tiny-local",
             "--generations", "1", "--llm-mode", "code")
    summary, out = evopool("run", *flags, "--max-calls", "0")
    assert out.returncode == 0, out.stderr
    assert summary["generations_run"] == [] and summary["generation"] == 0
    assert "--max-calls" in summary["stopped"] and "not complete" in out.stderr
    assert summary["llm"]["attempts"] == 0 and summary["llm"]["budget"]["remaining"]["calls"] == 0
    assert not fake_openai.requests

    fake_openai.reply(fenced(SPAM_CODE))
    fake_openai.reply(fenced(SPAM_CODE.replace("channel", "my video")))
    summary, out = evopool("run", *flags, "--max-calls", "2")
    assert out.returncode == 0, out.stderr
    assert summary["generations_run"] == [1] and summary["generation"] == 1 and "stopped" not in summary
    assert len(fake_openai.requests) == 2 and summary["llm"]["attempts"] == 2
    assert summary["llm"]["budget"]["remaining"]["calls"] == 0
    assert "LLM tiny-local (code): 2 calls" in out.stderr  # the usage summary, without -v
    store = Store.open(demo_ws)
    try:
        status = store.generations().set_index("number")["status"]
        assert status[1] == "complete"
        written = {a.written_by for a in store.annotators()}
        assert written == {"llm:tiny-local"}
    finally:
        Store.close_all()


# ---- mixed mode degrades -----------------------------------------------------------------------------
def test_mixed_mode_carries_on_without_a_dead_endpoint(demo_ws, tmp_path):
    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    summary, out = evopool("run", "--workdir", demo_ws, "--agents", "mixed", "--base-url", dead, "--generations",
                           "1", EVOPOOL_LLM_RETRIES="1")
    assert out.returncode == 0, out.stderr
    assert summary["generations_run"] == [1] and summary["pool_size"] > 0
    llm = summary["llm"]
    assert llm["failures"] == {"connection failed": llm["attempts"]} and llm["attempts"] >= 2
    assert "connection failed" in llm["stopped"]["llm"] and "the other agents carry on" in out.stderr
    assert "LLM stopped:" in out.stderr

    lines = evopool("pool", "--workdir", demo_ws)[1].stdout.strip().splitlines()
    assert {json.loads(line)["written_by"] for line in lines} == {"offline"}
    manifest_out = tmp_path / "labels.csv"
    result, out = evopool("export", "--workdir", demo_ws, "--out", str(manifest_out), "--aggregator", "mv")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(Path(result["manifest"]).read_text())
    assert {entry["written_by"] for entry in manifest["pool"]} == {"offline"}


# ---- structured mode ------------------------------------------------------------------------------------
def test_spec_replies_become_the_offline_templates():
    reply = ('```json\n[{"label": "SPAM", "cues": ["Free", "win*", "claim your prize now today ok"], '
             '"view": "sentence"},\n {"label": "maybe", "cues": ["x"]}]\n```')
    task = Task("sms", ("HAM", "SPAM"), {}, "")
    good, errors = parse_specs(reply, task)
    expected = render(AnnotatorSpec("cue", "SPAM", "sentence", ("free", "win*")))  # the 6-word "cue" is dropped
    assert [src for _, src in good] == [expected] and check_source(expected)
    assert len(errors) == 1 and "'maybe' is not one of" in errors[0]
    assert parse_specs("I cannot help with that.", task)[1][0].startswith("no JSON object found")
    # each spec in a fence of its own: all of them, not the last alone; an example in the prose around them is none
    apart = ('For example {"label": "HAM", "cues": ["example"]} would do. Mine:\n'
             '```json\n{"label": "SPAM", "cues": ["free"]}\n```\nand\n'
             '```json\n{"label": "HAM", "cues": ["lunch"]}\n```')
    assert [src for _, src in parse_specs(apart, task)[0]] == [
        render(AnnotatorSpec("cue", label, "sentence", (cue,))) for label, cue in (("SPAM", "free"), ("HAM", "lunch"))]


@pytest.mark.parametrize("reply", [
    '[{"label": "SPAM", "cues": ["free"], "view": "sentence", "confidence": {"p": 0.9}}]',  # a nested value
    '[{"label": "SPAM", "cues": ["free"], "reason": "offers {prizes}"}]',  # a brace inside a string
    '[{"label": "SPAM", "cues": ["{free}"]}]',
    '[{"label": "SPAM", "cues": ["free",], "view": "sentence",},]',  # trailing commas, common from small models
    '{"annotators": [{"label": "SPAM", "cues": ["free"]}]}',  # the schema's wrapper
    "[{'label': 'SPAM', 'cues': ['free'], 'reason': 'it's a prize, won't wait'}]",  # single quotes, apostrophes in
    "{'label':'SPAM','cues':[ 'free' ],}",  # ...and tight or spaced, with a trailing comma
    "[{'label': 'SPAM', 'cues': ['free'], 'reason': 'it\\'s a \"prize\", rock, 'n' roll'}]",  # escaped, quoted
])
def test_a_spec_is_read_whole_whatever_its_values_hold(reply):
    good, errors = parse_specs(f"```json\n{reply}\n```", Task("sms", ("HAM", "SPAM"), {}, ""))
    assert [src for _, src in good] == [render(AnnotatorSpec("cue", "SPAM", "sentence", ("free",)))] and not errors


@pytest.mark.parametrize("cues", ['"free, win, prize"', '["free, win, prize"]', '["free; win", "prize"]',
                                  '"free | win\\nprize"'])
def test_a_list_of_cues_written_as_one_string_is_several_cues(cues):
    good, errors = parse_specs(f'{{"label": "SPAM", "cues": {cues}}}', Task("sms", ("HAM", "SPAM"), {}, ""))
    assert [src for _, src in good] == [render(AnnotatorSpec("cue", "SPAM", "sentence", ("free", "win", "prize")))]


def test_a_spec_label_matches_exactly_before_it_matches_ignoring_case():
    def voted(label: str, labels: tuple[str, ...]) -> list[str]:
        reply = f'{{"label": {json.dumps(label)}, "cues": ["free"]}}'
        return [src for _, src in parse_specs(reply, Task("t", labels))[0]]

    def cue(label: str) -> list[str]:
        return [render(AnnotatorSpec("cue", label, "sentence", ("free",)))]

    assert voted("a", ("A", "a")) == cue("a") and voted("A", ("A", "a")) == cue("A")  # not swapped
    assert voted("spam", ("HAM", "SPAM")) == cue("SPAM")  # case alone is forgiven where it names one label
    assert voted("a ", ("A", "a")) == []  # ambiguous ignoring case: refused, not guessed


def test_a_spec_label_written_as_a_number_names_that_label_even_when_it_is_0():
    good, errors = parse_specs('[{"label": 0, "cues": ["free"]}, {"label": 1, "cues": ["win"]}]', Task("t", ("0", "1")))
    assert [src for _, src in good] == [render(AnnotatorSpec("cue", "0", "sentence", ("free",))),
                                        render(AnnotatorSpec("cue", "1", "sentence", ("win",)))] and not errors


def test_spec_mode_asks_for_json_and_proposes_rendered_annotators(fake_openai):
    fake_openai.reply('[{"label": "spam", "cues": ["free", "prize"], "view": "sentence"}]')
    proposer = LLMProposer(client_for(fake_openai), n_per_role=1, mode="spec")
    got = proposer.propose("generator", context_for([]))
    assert "Do not write code" in fake_openai.requests[0].body["messages"][0]["content"]
    assert [c.source for c in got] == [render(AnnotatorSpec("cue", "spam", "sentence", ("free", "prize")))]
    assert got[0].written_by == "llm:tiny-local"


def test_spec_mode_offers_the_views_the_offline_agents_mine(fake_openai):
    """On a relation task whose mentions are always close, "near" copies "between": the offline agents do not mine
    it, and spec mode neither offers it (contract, schema) nor takes it; where the mentions are often far apart
    it does both."""
    task = Task("rel", ("Down", "Up"), fields=("entity1", "entity2", "span1", "span2"))

    def row(i: int, middle: str) -> Example:
        text = f"drug D{i} {middle} kinase K{i}"
        spans = {"span1": [text.index(f"D{i}"), text.index(f"D{i}") + 2],
                 "span2": [text.index(f"K{i}"), text.index(f"K{i}") + 2]}
        return Example(f"d{i}", text, "dev", i % 2, {"entity1": f"D{i}", "entity2": f"K{i}", **spans})

    close = tuple(row(i, "inhibits") for i in range(8))
    far = close[:4] + tuple(row(i, "and in a long aside of many words also binds") for i in range(4, 8))
    reply = '[{"label": "Down", "cues": ["inhibit*"], "view": "near"}]'
    for dev, offered in ((close, False), (far, True)):
        fake_openai.reply(reply)
        fake_openai.reply(reply)  # the repair turn, if the first is refused
        sent = len(fake_openai.requests)
        context = ProposalContext(task, dev, (), (), {}, np.empty((len(dev), 0), dtype=np.int64), 1, 0)
        got = LLMProposer(client_for(fake_openai), n_per_role=1, parallel=1, mode="spec").propose("generator",
                                                                                                  context)
        body = fake_openai.requests[sent].body
        assert ('"near" =' in body["messages"][0]["content"]) is offered
        schema = body["response_format"]["json_schema"]["schema"]
        assert ("near" in schema["properties"]["annotators"]["items"]["properties"]["view"]["enum"]) is offered
        assert bool(got) is offered


def test_auto_mode_switches_to_specs_when_free_code_keeps_failing(fake_openai):
    for _ in range(4):  # two calls, each with its repair turn: syntax errors every time
        fake_openai.reply("```python\ndef annotate(example)\n    return 'spam'\n```")
    fake_openai.reply('{"label": "ham", "cues": ["lunch", "meeting"]}')
    events: list[tuple[str, dict]] = []
    proposer = LLMProposer(client_for(fake_openai), n_per_role=2, parallel=1, mode="auto",
                           on_event=lambda kind, payload: events.append((kind, payload)))
    assert proposer.propose("generator", context_for([])) == []
    assert proposer.writing == "spec" and any(kind == EventKind.LLM_NOTE for kind, _ in events)
    fake_openai.reply('{"label": "ham", "cues": ["dinner"]}')
    got = proposer.propose("improver", context_for([]))
    assert "Do not write code" in fake_openai.requests[4].body["messages"][0]["content"]
    assert len(got) == 2 and all("CUES = " in c.source for c in got)


# ---- cut-off replies ---------------------------------------------------------------------------------
def test_cut_off_is_blamed_only_when_the_reply_hit_max_tokens(fake_openai):
    broken = "```python\ndef annotate(example):\n    return ("
    fake_openai.reply(broken, finish_reason="length")
    fake_openai.reply(broken, finish_reason="length")
    fake_openai.reply(broken)
    fake_openai.reply(broken)
    proposer = LLMProposer(client_for(fake_openai), n_per_role=1, parallel=1)
    proposer.propose("generator", context_for([]))
    assert "max_tokens" in proposer.last_dropped[0][1]
    proposer.propose("generator", context_for([], generation=2))
    assert "max_tokens" not in proposer.last_dropped[0][1] and "cut off" not in proposer.last_dropped[0][1]


def test_a_same_seed_rerun_of_a_cut_off_reply_and_its_repair_is_free(fake_openai, tmp_path):
    """The cached reply keeps its finish reason: the rerun's repair prompt names the max_tokens limit again, so it
    is the first run's request and is answered from the store, not sent."""
    store = Store.open(tmp_path / "ws")
    fake_openai.reply("```python\ndef annotate(example):\n    return (", finish_reason="length")
    fake_openai.reply(fenced(FREE))
    first = LLMProposer(client_for(fake_openai, store=store), n_per_role=1, parallel=1)
    assert len(first.propose("generator", context_for([]))) == 1 and len(fake_openai.requests) == 2
    fake_openai.reply(fenced(FREE))  # served only if the rerun asked anew
    again = LLMProposer(client_for(fake_openai, store=store), n_per_role=1, parallel=1)
    assert len(again.propose("generator", context_for([]))) == 1
    assert len(fake_openai.requests) == 2 and again.usage()["cached"] == 2


def test_a_cut_off_spec_reply_is_blamed_on_max_tokens_as_code_is(fake_openai):
    fake_openai.reply('```json\n[{"label": "spam", "cues": ["free", "pri', finish_reason="length")
    fake_openai.reply('[{"label": "spam", "cues": ["free"]}]')
    LLMProposer(client_for(fake_openai), n_per_role=1, parallel=1, mode="spec").propose("generator", context_for([]))
    assert "max_tokens" in fake_openai.requests[1].last_user_message


THOUGHTS = ('<think>\nThe format is {"label": "spam", "cues": ["example"]}. Maybe {"label": "junk", "cues": ["x"]}?\n'
            '```json\n[{"label": "spam", "cues": ["free", \n```\nNo, simpler.\n</think>\n')


@pytest.mark.parametrize("mode, reply", [
    ("code", "<think>\nA draft:\n```python\ndef annotate(example):\n    return spam_if(\n```\nNo, simpler.\n"
             "</think>\n" + fenced(FREE)),
    ("spec", THOUGHTS + '```json\n[{"label": "spam", "cues": ["free"]}]\n```'),
    ("spec", 'The format is {"label": "ham", "cues": ["example"], "view": "sentence"}. My answer:\n'
             '```json\n[{"label": "spam", "cues": ["free"]}]\n```'),
])
def test_drafts_in_thoughts_and_examples_in_prose_are_not_the_answer(fake_openai, mode, reply):
    """A reasoning model served without a reasoning parser thinks aloud in <think>: its drafts are neither
    errors to repair nor annotators, nor is an example object quoted in the prose around the fenced answer."""
    fake_openai.reply(reply)
    got = LLMProposer(client_for(fake_openai), n_per_role=1, parallel=1, mode=mode).propose("generator",
                                                                                             context_for([]))
    expected = check_source(FREE) if mode == "code" else render(AnnotatorSpec("cue", "spam", "sentence", ("free",)))
    assert [c.source for c in got] == [expected] and len(fake_openai.requests) == 1


def test_an_annotator_in_an_unclosed_fence_is_a_candidate(fake_openai):
    fake_openai.reply("Sure:\n```python\n" + FREE)
    got = LLMProposer(client_for(fake_openai), n_per_role=1).propose("generator", context_for([]))
    assert [c.source for c in got] == [check_source(FREE)] and len(fake_openai.requests) == 1


# ---- adapting to the server ------------------------------------------------------------------------------
def test_timeouts_under_concurrency_make_the_client_serial_and_patient(fake_openai):
    fake_openai.hang(30)
    fake_openai.hang(30)
    fake_openai.reply("late but fine")
    fake_openai.reply("late but fine")
    client = client_for(fake_openai, timeout_s=1.0, max_parallel=4, max_retries=2)
    notes: list[str] = []
    client.on_note = notes.append
    barrier = threading.Barrier(2)
    replies: list[str] = []

    def ask(i: int) -> None:
        barrier.wait()
        replies.append(client.complete([{"role": "user", "content": f"q{i}"}], role="generator").text)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert replies == ["late but fine", "late but fine"]
    assert client.parallel == 1 and client.timeout_s >= 180
    assert len(notes) == 1 and "one at a time" in notes[0]
    assert client.usage.as_dict()["failures"] == {"timed out": 2}


def test_presets_fill_what_flags_and_environment_leave_unset():
    local = LLMConfig.from_env({"preset": "llamacpp"}, env={})
    assert (local.base_url, local.max_parallel, local.mode) == ("http://localhost:8080/v1", 1, "auto")
    assert local.timeout_s >= 180
    mine = LLMConfig.from_env({"preset": "llamacpp", "base_url": "http://box:9000/v1"},
                              env={"EVOPOOL_LLM_PARALLEL": "2"})
    assert (mine.base_url, mine.max_parallel) == ("http://box:9000/v1", 2)
    on_this_machine = LLMConfig.from_env({"base_url": "http://127.0.0.1:8080/v1"}, env={})
    assert (on_this_machine.preset, on_this_machine.max_parallel, on_this_machine.timeout_s) == ("local", 1, 300.0)
    assert LLMConfig.from_env({"base_url": "http://127.0.0.1:8080/v1"}, env={"EVOPOOL_LLM_PARALLEL": "4"}
                              ).max_parallel == 4
    assert LLMConfig.from_env({"base_url": "https://api.example.com/v1"}, env={}).max_parallel == 4
    with pytest.raises(ValueError, match="unknown LLM preset"):
        LLMConfig.from_env({"preset": "gpt-box"}, env={})


def test_an_llm_only_run_on_a_dead_endpoint_fails_in_one_line_and_still_reports_usage(demo_ws):
    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    summary, out = evopool("run", "--workdir", demo_ws, "--agents", "llm", "--base-url", dead, "--generations", "1",
                           EVOPOOL_LLM_RETRIES="0")
    assert out.returncode == 1 and summary is None
    assert "error: the generator call" in out.stderr and "connection failed" in out.stderr
    # the third call is not sent: two connections refused in a row stop the run's calls (issue 47)
    assert "2 HTTP attempts" in out.stderr and "failed attempts: 2 connection failed" in out.stderr
    assert "no price is known" not in out.stderr  # no dollar limit was given


def test_a_dollar_limit_on_a_model_without_a_price_is_said_to_never_stop_it(demo_ws):
    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    _, out = evopool("run", "--workdir", demo_ws, "--agents", "llm", "--base-url", dead, "--generations", "1",
                     "--model", "meta/llama-3.1-8b", "--max-usd", "0.5", EVOPOOL_LLM_RETRIES="0")
    assert "--max-usd: no price is known for meta/llama-3.1-8b" in out.stderr and "--prices FILE" in out.stderr
