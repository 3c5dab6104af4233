"""Background jobs: evolve runs in a thread, its events reach the store, stop works, failures are recorded."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import held_by_another_process

from engine.domain import Candidate, DevScores, SoftLabels
from engine.events import EventKind
from engine.ingest.importer import import_path
from engine.jobs import (
    DONE,
    FAILED,
    STOPPED,
    JobRegistry,
    start_evolve,
    start_labels,
)
from engine.store.saved_labels import load_labels, pool_key, save_labels
from engine.store.workspace import Store, WorkspaceLocked

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo" / "youtube_spam.csv"
WORDS = ["subscribe", "check", "channel", "song", "love", "http", "money", "video"]
LABEL_OF = {"song": "HAM", "love": "HAM"}


class KeywordProposer:
    """A tiny scripted proposer: each generation proposes new one-keyword annotators.

    It records the thread it ran on, and can be held at a gate so a test can stop the job mid-run.
    """

    name = "keywords"

    def __init__(self, gate: threading.Event | None = None, fail: bool = False):
        self.gate = gate
        self.fail = fail
        self.threads: set[str] = set()
        self.entered = threading.Event()

    def propose(self, role, context):
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail:
            raise RuntimeError("the proposer broke on purpose")
        if role != "generator":
            return []
        word = WORDS[(context.generation - 1) % len(WORDS)]
        source = (f"def annotate(example):\n    return {LABEL_OF.get(word, 'SPAM')!r} "
                  f"if {word!r} in example['text'].lower() else None\n")
        return [Candidate(source, "generator", name=f"keyword {word}")]


@pytest.fixture
def workdir(tmp_path) -> Path:
    path = tmp_path / "ws"
    import_path(Store.open(path), DEMO)
    return path


def test_evolve_job_runs_in_a_background_thread_and_its_events_reach_the_store(workdir):
    registry = JobRegistry()
    proposer = KeywordProposer()
    job = start_evolve(workdir, 2, proposer=proposer, registry=registry)
    assert job.wait(120)
    assert job.status == DONE, job.error
    assert job.result == [1, 2]
    assert proposer.threads == {f"evopool-{job.id}"}  # never the caller's thread
    store = Store.open(workdir)
    assert store.last_complete_generation() == 2
    kinds = [e["kind"] for e in store.events(job.id, limit=10_000)]
    for kind in ("generation_started", "agent_started", "candidate", "executing", "scored", "verdict",
                 "generation_complete"):
        assert kind in kinds
    assert kinds.count("generation_complete") == 2
    assert all(type(k) is str for k in kinds) and set(kinds) <= {k.value for k in EventKind}  # stored as plain text
    row = store.jobs().set_index("id").loc[job.id]
    assert row["status"] == "done" and row["kind"] == "evolve"
    assert row["progress"] == pytest.approx(1.0)
    assert registry.running(workdir) is None
    assert registry.latest(workdir, "evolve") is job


def test_stop_finishes_the_current_generation_then_stops(workdir):
    registry = JobRegistry()
    gate = threading.Event()
    proposer = KeywordProposer(gate)
    job = start_evolve(workdir, 3, proposer=proposer, registry=registry)
    assert proposer.entered.wait(30)
    job.stop()
    gate.set()
    assert job.wait(120)
    assert job.status == STOPPED
    store = Store.open(workdir)
    assert store.last_complete_generation() == 1  # generation 1 finished, 2 and 3 never started
    kinds = [e["kind"] for e in store.events(job.id, limit=10_000)]
    assert kinds[-1] == "stopped"
    assert store.jobs().set_index("id").loc[job.id, "status"] == "stopped"


def test_stop_now_abandons_the_unfinished_generation(workdir):
    registry = JobRegistry()
    gate = threading.Event()
    proposer = KeywordProposer(gate)
    job = start_evolve(workdir, 3, proposer=proposer, registry=registry)
    assert proposer.entered.wait(30)
    job.stop(now=True)
    gate.set()
    assert job.wait(120)
    assert job.status == STOPPED
    store = Store.open(workdir)
    assert store.last_complete_generation() == 0
    generations = store.generations()
    assert list(generations["status"]) == ["running"]  # redone by the next run
    again = start_evolve(workdir, 1, proposer=KeywordProposer(), registry=registry)
    assert again.wait(120) and again.status == DONE
    assert store.last_complete_generation() == 1


def test_a_failing_job_records_its_error(workdir):
    registry = JobRegistry()
    job = start_evolve(workdir, 1, proposer=KeywordProposer(fail=True), registry=registry)
    assert job.wait(60)
    assert job.status == FAILED
    assert "the proposer broke on purpose" in job.error
    store = Store.open(workdir)
    row = store.jobs().set_index("id").loc[job.id]
    assert row["status"] == "failed" and "the proposer broke on purpose" in row["error"]
    failed = [e for e in store.events(job.id) if e["kind"] == "failed"]
    assert len(failed) == 1 and "RuntimeError" in failed[0]["error"]


def test_one_running_job_per_workspace_and_kind(workdir):
    registry = JobRegistry()
    gate = threading.Event()
    proposer = KeywordProposer(gate)
    job = start_evolve(workdir, 1, proposer=proposer, registry=registry)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            start_evolve(workdir, 1, proposer=KeywordProposer(), registry=registry)
    finally:
        gate.set()
        job.wait(120)
    assert job.status == DONE


def test_an_empty_workspace_fails_with_a_readable_message(tmp_path):
    registry = JobRegistry()
    Store.open(tmp_path / "empty")
    job = start_evolve(tmp_path / "empty", 1, proposer=KeywordProposer(), registry=registry)
    assert job.wait(30)
    assert job.status == FAILED and "import a dataset first" in job.error


def test_saved_soft_labels_round_trip_and_know_their_pool(workdir):
    class Result:  # what engine.labeling returns, reduced to the fields the studio keeps
        soft = SoftLabels(np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]]), ("a", "b", "c"), "mv")
        hard = np.array([0, 1, -1])
        n_votes = np.array([2, 1, 0])
        dev_scores = DevScores(macro_f1=0.75)

    store = Store.open(workdir)
    key = pool_key(store)
    comparison = [{"aggregator": "mv", "macro_f1": 0.75}, {"aggregator": "ds", "macro_f1": 0.7}]
    save_labels(workdir, "auto", Result(), comparison, key)
    saved = load_labels(workdir, "auto")
    assert saved.resolved == "mv" and saved.aggregator == "auto"
    assert saved.example_ids == ("a", "b", "c")
    np.testing.assert_allclose(saved.probs, Result.soft.probs)
    assert saved.hard.tolist() == [0, 1, -1] and saved.n_votes.tolist() == [2, 1, 0]
    assert saved.dev_scores == DevScores(macro_f1=0.75)
    assert saved.comparison["aggregator"].tolist() == ["mv", "ds"]
    assert saved.pool_key == key
    assert saved.created_at.endswith("+00:00")  # the manifest's computed_at: UTC, said
    assert load_labels(workdir, "ds") is None
    # a reader between a recompute's two writes, or of a half-written file, gets nothing rather than a wrong pair
    labels_dir = Path(workdir) / "labels"
    first_json = (labels_dir / "auto.json").read_bytes()
    save_labels(workdir, "auto", Result(), comparison[:1], key)
    (labels_dir / "auto.json").write_bytes(first_json)
    assert load_labels(workdir, "auto") is None
    save_labels(workdir, "auto", Result(), comparison[:1], key)
    assert load_labels(workdir, "auto").comparison["aggregator"].tolist() == ["mv"]
    whole = (labels_dir / "auto.npz").read_bytes()
    (labels_dir / "auto.npz").write_bytes(whole[: len(whole) // 2])
    assert load_labels(workdir, "auto") is None
    assert not [p.name for p in labels_dir.iterdir() if "partial" in p.name]
    registry = JobRegistry()
    job = start_evolve(workdir, 1, proposer=KeywordProposer(), registry=registry)
    assert job.wait(120) and job.status == DONE
    assert pool_key(store) != key  # the pool changed: the saved labels are stale


def test_labels_job_labels_every_row_and_saves_them(workdir):
    registry = JobRegistry()
    evolve_job = start_evolve(workdir, 2, proposer=KeywordProposer(), registry=registry)
    assert evolve_job.wait(120) and evolve_job.status == DONE
    store = Store.open(workdir)
    job = start_labels(workdir, "mv", compare=False, registry=registry)
    assert job.wait(120)
    assert job.status == DONE, job.error
    saved = load_labels(workdir, "mv")
    assert saved is not None and saved.resolved == "mv"
    assert len(saved.example_ids) == store.count_examples() == 2056
    assert saved.probs.shape == (2056, 2)
    np.testing.assert_allclose(saved.probs.sum(axis=1), 1.0)
    # majority vote gives no label exactly where no annotator voted
    assert ((saved.hard == -1) == (saved.n_votes == 0)).all()
    assert saved.pool_key == pool_key(store)
    assert saved.dev_scores.macro_f1 is not None


def test_a_job_that_cannot_start_leaves_the_workspace_free(tmp_path):
    ws = tmp_path / "busy"
    Store.open(ws)
    Store.close_all()
    registry = JobRegistry()
    with held_by_another_process(ws):
        with pytest.raises(WorkspaceLocked):
            registry.start("evolve", ws, lambda ctx: None)
        assert registry.running(ws, "evolve") is None  # was left "running" with no thread: every start refused
    job = registry.start("evolve", ws, lambda ctx: "done")
    assert job.wait(30) and job.status == DONE


def test_stop_now_cuts_an_llm_call_in_flight_instead_of_waiting_for_its_answer(workdir, fake_openai):
    from engine.agents.llm.proposer import LLMProposer
    from engine.llm.client import OpenAICompatibleClient
    from engine.llm.config import LLMConfig

    fake_openai.hang(60, then="too late")  # a one-request-at-a-time local server, slow to answer
    client = OpenAICompatibleClient(LLMConfig(base_url=fake_openai.base_url, api_key="sk-test", timeout_s=120,
                                              max_retries=0))
    registry = JobRegistry()
    job = start_evolve(workdir, 1, proposer=LLMProposer(client, n_per_role=1, parallel=1), registry=registry)
    deadline = time.monotonic() + 30
    while not fake_openai.requests and time.monotonic() < deadline:  # the call is on the wire
        time.sleep(0.05)
    assert fake_openai.requests
    asked = time.monotonic()
    job.stop(now=True)
    assert job.wait(20) and time.monotonic() - asked < 10  # waited out the 60 s answer before
    assert job.status == STOPPED and job.error is None


@pytest.mark.parametrize("wrench", [False, True])
def test_an_import_job_reports_its_stages_as_it_goes(tmp_path, monkeypatch, wrench):
    """The studio's bar stood at 30 % for the whole import: the job now says which stage it is in, and how far (a
    WRENCH folder too)."""
    from test_ingest import wrench_folder

    from engine.ingest.importer import IngestOptions
    from engine.jobs import JobContext, start_import

    seen: list[tuple[float, str]] = []
    record = JobContext.set_progress

    def recording(self, progress=None, message=None):
        seen.append((self.job.progress if progress is None else progress, message or ""))
        record(self, progress, message)

    monkeypatch.setattr(JobContext, "set_progress", recording)
    frame = pd.read_csv(DEMO, dtype=str, keep_default_na=False)
    folder = None
    if wrench:  # the demo's rows as a WRENCH folder
        records = {split: json.dumps({str(i): {"data": {"text": text}, "label": int(label == "SPAM")}
                                      for i, (text, label) in enumerate(zip(part["text"], part["label"], strict=True))})
                   for split, part in (("train", frame.iloc[:300]), ("valid", frame.iloc[300:]))}
        folder = wrench_folder(tmp_path / "demo", '{"0": "HAM", "1": "SPAM"}', **records)
    source = str(folder) if wrench else "demo.csv"
    job = start_import(tmp_path / "ws", None if wrench else frame, IngestOptions(), dataset="demo", source=source,
                       wrench_folder=str(folder) if wrench else None, registry=JobRegistry(), embed_after=False)
    assert job.wait(60) and job.status == DONE, job.error
    shares = [share for share, _ in seen]
    assert shares == sorted(shares) and len(set(shares)) >= 3  # it moves forward, stage by stage
    assert any(what.startswith(f"checking {len(frame):,} rows of ") for _, what in seen)
    assert any(what.startswith("writing ") for _, what in seen)


def test_the_bar_follows_the_counted_work_of_a_stage_and_never_goes_back(tmp_path):
    """Computing soft labels sat at 5% for a minute while its text counted 4,000 rows embedded, then jumped to 70%
    (a browser walk): counted work now fills the stage's share of the bar."""
    from engine.jobs import Job, JobContext
    from engine.store.workspace import Store

    store = Store.open(tmp_path / "ws")
    ctx = JobContext(Job("j1", "labels", tmp_path / "ws", {}), store)
    ctx.begin_stage(0.1, 0.5, "labeling")
    ctx.emit(EventKind.EMBEDDING, {"done": 50, "total": 100})
    assert ctx.job.progress == pytest.approx(0.3) and ctx.job.message == "embedding texts: 50 / 100"
    ctx.emit(EventKind.EXECUTE_PROGRESS, {"done": 10, "total": 100, "split": "pool"})  # a new pass from 0
    assert ctx.job.progress == pytest.approx(0.3)
    ctx.emit(EventKind.EXECUTE_PROGRESS, {"done": 100, "total": 100, "split": "pool"})
    assert ctx.job.progress == pytest.approx(0.5)
    ctx.begin_stage(0.5, 0.9, "comparing")
    assert ctx.job.progress == pytest.approx(0.5) and ctx.job.message == "comparing"


def test_an_import_embeds_every_row_in_a_job_of_its_own(tmp_path, monkeypatch):
    """Soft labels waited minutes for embeddings nothing computed while the expert read the data and evolved."""
    from engine.embed import shared_cache
    from engine.embed.base import text_hash
    from engine.ingest.importer import IngestOptions
    from engine.jobs import start_import

    monkeypatch.setenv("EVOPOOL_CACHE", str(tmp_path / "cold-cache"))
    shared_cache.forget()
    frame = pd.read_csv(DEMO, dtype=str, keep_default_na=False).iloc[1500:1800]  # pool and dev rows
    registry = JobRegistry()
    job = start_import(tmp_path / "ws", frame, IngestOptions(), dataset="demo", source="demo.csv", registry=registry)
    assert job.wait(60) and job.status == DONE, job.error
    embedding = registry.latest(tmp_path / "ws", "embed")
    assert embedding is not None and embedding.wait(180) and embedding.status == DONE, embedding.error
    store = Store.open(tmp_path / "ws")
    hashes = {text_hash(t) for t in store.examples_frame()["text"]}
    assert embedding.result == 300 and len(store.cached_embeddings("all-MiniLM-L6-v2", list(hashes))) == len(hashes)


def test_the_soft_labels_wait_for_a_running_embedding_job_instead_of_embedding_the_same_texts(workdir):
    registry = JobRegistry()
    evolve_job = start_evolve(workdir, 1, proposer=KeywordProposer(), registry=registry)
    assert evolve_job.wait(120) and evolve_job.status == DONE
    release = threading.Event()
    embedding = registry.start("embed", workdir, lambda ctx: release.wait(60))
    labels = start_labels(workdir, "mv", compare=False, registry=registry)
    deadline = time.monotonic() + 30
    while "waiting for the embeddings" not in labels.message and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "waiting for the embeddings" in labels.message and labels.running
    release.set()
    assert embedding.wait(30) and labels.wait(120) and labels.status == DONE, labels.error


def test_the_labels_are_saved_before_the_comparison_so_the_screen_shows_them_first(workdir, monkeypatch):
    """On ChemProt the comparison took twice as long as the labels themselves, and the screen waited for both."""
    from engine.labeling import evaluate

    registry = JobRegistry()
    assert start_evolve(workdir, 1, proposer=KeywordProposer(), registry=registry).wait(120)
    comparing, release = threading.Event(), threading.Event()
    real = evaluate.compare_aggregators

    def held(*args, **kwargs):
        comparing.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "compare_aggregators", held)
    job = start_labels(workdir, "mv", compare=True, registry=registry)
    assert comparing.wait(120)
    early = load_labels(workdir, "mv")
    assert job.running and early is not None and early.comparison.empty  # the labels, the comparison to come
    assert "soft labels saved" in job.message
    release.set()
    assert job.wait(300) and job.status == DONE, job.error
    later = load_labels(workdir, "mv")
    assert not later.comparison.empty and np.array_equal(later.probs, early.probs)
    assert job.elapsed_s() == job.elapsed_s()  # a finished job's duration stands still
