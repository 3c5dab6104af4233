"""The client adapting to the server it talks to (issue 17): constrained decoding in the `response_format`
shape the server accepts, a server answering one request at a time told by its latencies, and requests
nobody waits for cancelled so the server sees their connections closed. Against the scripted server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer
from test_llm_agents import DEV, TASK, context_for
from test_llm_runs import client_for, evopool

from engine.agents.llm.prompts import label_vocabulary
from engine.agents.llm.proposer import LLMProposer
from engine.agents.llm.spec_mode import spec_schema
from engine.events import EventKind
from engine.llm.adapt import LatencyWatch, rejects_format, stretched_timeout
from engine.specs.templates import AnnotatorSpec, render

ROOT = Path(__file__).resolve().parents[1]
SPEC_REPLY = '{"annotators": [{"label": "spam", "cues": ["free", "prize"], "view": "sentence"}]}'
LLAMA_CPP_PYTHON_500 = ("1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
                        "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}")


def _wait_for(condition, seconds: float = 30.0) -> bool:
    """Poll `condition` until it holds or `seconds` pass (a deadline for a hung run, not a measurement)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# ---- constrained decoding ----------------------------------------------------------------------------------
def test_spec_calls_carry_the_schema_and_code_calls_none(fake_openai):
    fake_openai.reply(SPEC_REPLY)
    fake_openai.reply("```python\nx = 1\n```")
    fake_openai.reply("```python\nx = 1\n```")
    got = LLMProposer(client_for(fake_openai), n_per_role=1, mode="spec").propose("generator", context_for([]))
    assert [c.source for c in got] == [render(AnnotatorSpec("cue", "spam", "sentence", ("free", "prize")))]
    aimed = TASK.labels[1]  # generation 1's first generator call takes the second label
    words = label_vocabulary(context_for([]), aimed)
    sent = fake_openai.requests[0].body["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {"name": "annotator_specs",
                                                           "schema": spec_schema(TASK, 2, aimed, words)}}
    item = sent["json_schema"]["schema"]["properties"]["annotators"]["items"]
    assert item["properties"]["label"]["enum"] == [aimed] and item["required"] == ["label", "cues", "view"]
    assert item["properties"]["cues"]["items"]["enum"] == words and words
    aimed_rows = " ".join(ex.text.lower() for ex in DEV if ex.label == TASK.labels.index(aimed))
    assert all(w in aimed_rows for w in words)  # every offered word is in that label's dev rows
    asked = fake_openai.requests[0].last_user_message
    assert f'that vote "{aimed}"' in asked and ", ".join(words) in asked
    LLMProposer(client_for(fake_openai), n_per_role=1, mode="code").propose("generator", context_for([]))
    assert "response_format" not in fake_openai.requests[1].body


def test_spec_calls_take_the_labels_in_turn(fake_openai):
    for _ in range(2):
        fake_openai.reply(SPEC_REPLY)
    LLMProposer(client_for(fake_openai), n_per_role=2, parallel=1, mode="spec").propose(
        "generator", context_for([], generation=2))
    enums = [r.body["response_format"]["json_schema"]["schema"]["properties"]["annotators"]["items"]
             ["properties"]["label"]["enum"] for r in fake_openai.requests]
    assert enums == [[TASK.labels[0]], [TASK.labels[1]]]


def test_a_refused_format_is_asked_again_in_the_next_shape_and_remembered(fake_openai):
    fake_openai.fail(500, message=LLAMA_CPP_PYTHON_500)  # llama-cpp-python: json_schema -> 500, not retried
    fake_openai.reply(SPEC_REPLY)
    fake_openai.fail(400, message="response_format of type json_object is not supported by this model")
    fake_openai.reply(SPEC_REPLY)
    fake_openai.reply(SPEC_REPLY)
    client = client_for(fake_openai, max_retries=3)
    notes: list[str] = []
    client.on_note = notes.append
    schema = spec_schema(TASK, 2)
    for seed in range(3):
        assert client.complete([{"role": "user", "content": "cues"}], role="generator", seed=seed,
                               schema=schema).text == SPEC_REPLY
    formats = [r.body.get("response_format") for r in fake_openai.requests]
    assert [f and f["type"] for f in formats] == ["json_schema", "json_object", "json_object", None, None]
    assert formats[1]["schema"] == schema
    assert len(notes) == 2 and "json_schema" in notes[0] and "without one" in notes[1]
    usage = client.usage.as_dict()
    assert usage["failures"] == {"response_format refused": 2} and usage["attempts"] == 5
    assert client.budget.spent()["calls"] == 5 and client.format_shape is None


def test_only_errors_that_blame_the_format_count_as_refusals():
    assert rejects_format(500, LLAMA_CPP_PYTHON_500)
    assert rejects_format(422, "body.response_format.json_schema: field required")
    assert rejects_format(400, "Invalid schema for response_format 'annotator_specs'")
    assert not rejects_format(400, "This model's maximum context length is 2048 tokens")
    assert not rejects_format(401, "response_format needs a key")  # credentials are never a format problem
    assert not rejects_format(503, "server overloaded")


# ---- a server that answers one at a time ------------------------------------------------------------------
def _watch(points: list[tuple[int, float]]) -> LatencyWatch:
    watch = LatencyWatch()
    for k, latency in points:
        watch.add(k, latency, tokens_out=50)
    return watch


def test_latency_growing_with_requests_in_flight_means_a_serial_server():
    queueing = _watch([(1, 2.0), (2, 4.1), (3, 5.9), (4, 8.2), (4, 7.8)])
    batching = _watch([(1, 2.0), (2, 2.2), (3, 2.1), (4, 2.5), (4, 2.4)])
    assert queueing.serialised() and queueing.growth() > 0.8
    assert not batching.serialised() and batching.growth() < 0.2
    assert _watch([(1, 2.0), (2, 4.0), (3, 6.0)]).growth() is None  # too few answers
    assert _watch([(4, 2.0), (4, 8.0), (4, 3.0), (4, 9.0)]).growth() is None  # one level of parallelism only
    assert stretched_timeout(60, 20, 600) is None and stretched_timeout(60, 40, 600) == 120
    assert stretched_timeout(300, 280, 600) == 600 and stretched_timeout(600, 590, 600) is None


def test_a_serial_server_makes_the_client_send_one_at_a_time_before_anything_times_out():
    with FakeOpenAIServer(serial=True) as server:
        for i in range(10):
            server.hang(0.25, then=f"reply {i}")
        client = client_for(server, timeout_s=60.0, max_parallel=4, max_retries=0)
        notes: list[str] = []
        client.on_note = notes.append
        replies: list[str] = []
        threads = [threading.Thread(target=lambda i=i: replies.append(
            client.complete([{"role": "user", "content": f"q{i}"}], role="generator", seed=i).text))
            for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert sorted(replies) == sorted(f"reply {i}" for i in range(10))
    assert client.parallel == 1 and client.usage.as_dict()["failures"] == {}
    assert len(notes) == 1 and "latency grew" in notes[0] and "one at a time" in notes[0]


def test_a_batching_server_keeps_its_parallel_requests(fake_openai):
    for i in range(8):
        fake_openai.hang(0.25, then=f"reply {i}")
    client = client_for(fake_openai, timeout_s=60.0, max_parallel=4, max_retries=0)
    threads = [threading.Thread(target=client.complete, args=([{"role": "user", "content": f"q{i}"}],),
                                kwargs={"role": "generator", "seed": i}) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(client.latencies.samples) == 8 and fake_openai.max_in_flight == 4
    assert client.parallel == 4 and client.notes == []


# ---- cancelling what nobody waits for ---------------------------------------------------------------------
class Stop(Exception):
    """What a studio job's event sink raises when the expert stops the run at once."""


def test_a_stopped_run_closes_the_connections_of_its_calls_in_flight():
    with FakeOpenAIServer(serial=True) as server:
        server.hang(0.5, then=SPEC_REPLY)  # the first call served is answered soon ...
        server.hang(30, then=SPEC_REPLY)  # ... the next one is being generated and the third waits its turn
        server.hang(30, then=SPEC_REPLY)
        client = client_for(server, timeout_s=60.0, max_parallel=3, max_retries=0)

        def sink(kind: str, payload: dict) -> None:
            if kind == EventKind.LLM_CALL:
                raise Stop  # the expert stops the run as soon as the first answer is in

        proposer = LLMProposer(client, n_per_role=3, parallel=3, mode="spec", on_event=sink)
        with pytest.raises(Stop):
            proposer.propose("generator", context_for([]))
        # both dropped unanswered, not generated to the end: the one being generated and the one in line (which
        # the server may or may not have begun when the close reached it, depending on the machine's load)
        assert _wait_for(lambda: len(server.closed_by_client) == 2)
        assert len(server.requests) == 3 and server.answered == 1
    assert client.usage.as_dict()["failed_calls"] == 2
    assert any("connection(s) to the server closed" in n for n in proposer.notes)


def _ctrl_c_as_in_a_terminal() -> None:
    """A suite started in the background (`cmd &`) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt in the child: restore the default, as a terminal gives it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_call_closes_its_connection_and_still_reports_usage(tmp_path: Path, demo_csv: Path):
    ws = str(tmp_path / "ws")
    _, out = evopool("run", str(demo_csv), "--workdir", ws, "--generations", "0")
    assert out.returncode == 0, out.stderr
    with FakeOpenAIServer() as server:
        server.hang(120, then="```python\nx = 1\n```")
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", "--workdir", ws, "--agents", "llm",
                                 "--base-url", server.base_url, "--generations", "1"], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                                preexec_fn=_ctrl_c_as_in_a_terminal)
        try:
            assert _wait_for(lambda: len(server.requests) == 1, 120), "the run never called the LLM"
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert _wait_for(lambda: len(server.closed_by_client) == 1)
    assert proc.returncode == 130 and "interrupted" in stderr
    assert "1 calls" in stderr and "HTTP attempts" in stderr
    assert not stdout.strip() or "generations_run" not in json.loads(stdout.strip().splitlines()[-1])
