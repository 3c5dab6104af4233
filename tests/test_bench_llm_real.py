"""bench/llm_real.py never reports a dead server as a result (issue 47): a llama.cpp server built for another CPU
answered /v1/models, died on its first chat request, and the bench wrote "code 0, spec 0 candidates, timeouts 0"
and an offline-against-offline comparison from 36 refused connections. Run against the scripted server, through the
bench's command line as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fake_openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]


def bench(server: FakeOpenAIServer, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/llm_real.py", "--base-url", server.base_url, "--model", "tiny",
                           "--datasets", "demo", "--max-calls", "4", "--results", str(results)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})


def test_a_server_that_dies_on_the_first_chat_request_stops_the_bench(tmp_path):
    with FakeOpenAIServer() as server:
        server.die()  # it answers /v1/models, then the first chat request kills it
        out = bench(server, tmp_path / "results")
    assert out.returncode == 1, out.stderr
    assert f"failed: the server at {server.base_url} gave no test chat completion" in out.stderr
    assert "-DGGML_NATIVE=OFF" in out.stderr  # the likely cause of such a crash, and its fix
    assert not (tmp_path / "results").exists()
    assert len(server.requests) == 1  # the test completion, and no run after it


def test_a_server_that_refuses_every_request_stops_the_bench(tmp_path):
    with FakeOpenAIServer() as server:  # nothing scripted: every chat request gets HTTP 500
        out = bench(server, tmp_path / "results")
    assert out.returncode == 1, out.stderr
    assert f"failed: the server at {server.base_url} refused a test chat completion (HTTP 500" in out.stderr
    assert not (tmp_path / "results").exists()


def test_a_run_whose_attempts_all_failed_is_marked_failed_not_measured(tmp_path):
    with FakeOpenAIServer() as server:
        server.reply("OK")  # the test completion passes; the server dies on the first run's first request
        server.die()
        out = bench(server, tmp_path / "results")
    assert out.returncode == 1, out.stderr
    said = next(line for line in out.stderr.splitlines() if line.startswith("llm_real: failed:"))
    assert f"--llm-mode code: all 2 HTTP attempts to the server at {server.base_url} failed (2 connection failed)" \
           in said
    assert not (tmp_path / "results").exists()
    partial = json.loads(Path(said.rsplit("partial report: ", 1)[1].rstrip(")")).read_text())
    assert partial["modes"]["code"]["failed"].startswith("all 2 HTTP attempts") and "spec" not in partial["modes"]
    assert partial["modes"]["code"]["answered"] == 0 and partial["meta"]["commit"]
