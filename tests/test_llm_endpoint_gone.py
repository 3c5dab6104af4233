"""The LLM path when the server goes away mid-run, and the advice after free code that never passes: each test is a
defect found against a real llama-cpp-python server (issue 47). The real `openai` client talks HTTP to the scripted
server (fake_openai_server.py), which `die()`s as a crashed server process does: the request in hand is closed
unanswered and every later connection is refused."""
from __future__ import annotations

import pytest
from fake_openai_server import FakeOpenAIServer
from test_llm_runs import SPAM_CODE, evopool

from engine.agents.llm.proposer import LLMProposer
from engine.llm.client import OpenAICompatibleClient
from engine.llm.config import LLMConfig
from engine.llm.seam import LLMCallSkipped, LLMEndpointDown

MESSAGES = [{"role": "user", "content": "Write an annotator."}]


def test_a_crashed_server_costs_two_attempts_then_no_call_is_sent(fake_openai, store):
    """A server that died on a request cost 5 refused attempts per call (the openai client's 4 retries), 15 for the
    improver's three calls, before the agents stopped."""
    fake_openai.reply("fine")
    fake_openai.die()
    client = OpenAICompatibleClient(LLMConfig(base_url=fake_openai.base_url, model="m", max_retries=4), store=store)
    assert client.complete(MESSAGES, role="generator").text == "fine"
    with pytest.raises(LLMEndpointDown, match=f"failed after 2 attempts: connection failed.*the LLM endpoint at "
                                              f"{fake_openai.base_url} stopped answering"):
        client.complete(MESSAGES, role="improver", seed=1)
    with pytest.raises(LLMCallSkipped, match="the refiner call was not sent: the LLM endpoint at .* stopped"):
        client.complete(MESSAGES, role="refiner", seed=2)
    errors = store.llm_calls()["error"].dropna().tolist()
    assert len(errors) == 2 and all(e.startswith("connection failed") for e in errors)
    assert client.usage.as_dict()["failures"] == {"connection failed": 2}


def test_connection_failures_with_an_answer_between_them_do_not_stop_the_run(fake_openai):
    """Only failures in a row stop the run: a dropped connection that the retry gets past is a blip, not a dead
    server."""
    client = OpenAICompatibleClient(LLMConfig(base_url=fake_openai.base_url, model="m", max_retries=1))
    for seed in range(3):
        fake_openai.drop()
        fake_openai.reply(f"answer {seed}")
        assert client.complete(MESSAGES, role="generator", seed=seed).text == f"answer {seed}"
    assert client.stopped_answering is None and client.usage.as_dict()["failures"] == {"connection failed": 3}


def test_after_the_endpoint_stops_no_later_agent_claims_its_own_calls_failed(demo_ws):
    """A mixed run whose server was killed: the refiner of generation 1 and the agents of generation 2 said "all 3
    drafts were dropped: 3x LLM call failed: the improver call...", though they sent nothing."""
    with FakeOpenAIServer() as server:
        for n in range(3):  # the generator's three calls; the improver's first request crashes the server
            server.reply(f"```python\n{SPAM_CODE.replace('Links and', f'Links ({n}) and')}```")
        server.die()
        summary, out = evopool("run", "--workdir", demo_ws, "--agents", "mixed", "--base-url", server.base_url,
                               "--model", "tiny-local", "--generations", "2")
    assert out.returncode == 0, out.stderr
    assert summary["generations_run"] == [1, 2]
    llm = summary["llm"]
    assert llm["failures"] == {"connection failed": 2}, out.stderr  # at most 2 refused, with default retries (4)
    assert llm["attempts"] == 5 and llm["stopped"]["llm"].startswith("the llm agents stopped at the improver of "
                                                                     "generation 1")
    finished = [line for line in out.stderr.splitlines() if "agent finished:" in line]
    assert len(finished) == 6, out.stderr
    after_stop = finished[2:]  # the refiner of generation 1 and the three agents of generation 2
    for line in after_stop:
        assert "LLM call failed" not in line and "drafts were dropped" not in line, line
        assert "skipped: the LLM endpoint stopped answering in generation 1 (at the improver)" in line, line


class _Quiet:
    """A member that proposes nothing: what the mixed proposer says is then the LLM member's alone."""

    name = "quiet"

    def propose(self, role, context):
        return []


def test_a_later_role_names_the_role_where_the_endpoint_stopped(fake_openai):
    """The improver's first call was answered and its second crashed the server: the improver keeps what it got, and
    every later role says it was skipped because of the improver, not because of itself."""
    from test_llm_agents import context_for

    from engine.agents.mixed import MixedProposer
    from engine.evolve import empty_reason

    fake_openai.reply(f"```python\n{SPAM_CODE}```")
    fake_openai.die()
    llm = LLMProposer(OpenAICompatibleClient(LLMConfig(base_url=fake_openai.base_url, model="m", max_parallel=1)),
                      n_per_role=2, mode="code")
    mixed = MixedProposer(llm, _Quiet())
    context = context_for([])
    assert len(mixed.propose("improver", context)) == 1 and not mixed.stopped
    note = "llm skipped: the LLM endpoint stopped answering in generation 1 (at the improver); no call sent"
    assert mixed.propose("refiner", context) == []  # the LLM member stops here, sending nothing
    assert empty_reason(mixed).endswith(": " + note.removeprefix("llm ")) and "failed" not in empty_reason(mixed)
    assert mixed.propose("generator", context) == [] and empty_reason(mixed) == note
    assert len(fake_openai.requests) == 2


def test_when_every_free_code_draft_fails_the_advice_is_spec_mode(fake_openai):
    """After a code-mode run whose 12 drafts all failed the checks, the closing advice said "label more dev rows"."""
    for _ in range(2):
        fake_openai.reply("I would look for links, but here is no code.")
    proposer = LLMProposer(OpenAICompatibleClient(LLMConfig(base_url=fake_openai.base_url, model="tiny",
                                                            max_retries=0)), n_per_role=1, mode="code")
    from test_llm_agents import context_for

    assert proposer.propose("generator", context_for([])) == []
    usage = proposer.usage()
    assert usage["code_drafts"] == {"checked": 2, "passed": 0}
    assert "--llm-mode spec" in usage["advice"] and "Small models write specs they can fill" in usage["advice"]
    # once a draft passes, or in spec mode, there is nothing to advise
    fake_openai.reply(f"```python\n{SPAM_CODE}```")
    proposer.propose("improver", context_for([]))
    assert "advice" not in proposer.usage()


def test_a_code_mode_run_closes_with_the_spec_mode_advice(fake_openai, demo_ws):
    for _ in range(2):
        fake_openai.reply("Sorry, I cannot write Python.")
    summary, out = evopool("run", "--workdir", demo_ws, "--agents", "llm", "--llm-mode", "code", "--base-url",
                           fake_openai.base_url, "--model", "tiny-local", "--generations", "1", "--max-calls", "2")
    assert out.returncode == 0, out.stderr
    closing = out.stderr.strip().splitlines()[-1]
    assert closing.startswith("advice: none of the 2 free-code replies passed the checks: run with --llm-mode spec")
    assert "label more dev rows" not in closing and summary["llm"]["advice"] in closing


@pytest.fixture
def demo_ws(tmp_path, demo_csv) -> str:
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    return ws
