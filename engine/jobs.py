"""Long work (evolving the pool, computing soft labels) runs here, in server-owned threads.

The studio never runs long work inside a page script: it starts a job, and the job writes its progress
events to the workspace (`store.add_event`) and its status to the `jobs` table (`store.upsert_job`).
Pages only poll the store. The registry is process-wide, so a job outlives the browser tab that
started it and a reloaded page finds it again. Soft labels, once computed, are kept as files in the
workspace folder (keyed by the pool they came from; see `engine.store.saved_labels`), so pages stay fast and a
reload keeps them.
"""
from __future__ import annotations

import os
import shlex
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from engine.agents.choice import DEFAULT_AGENTS, make_proposer
from engine.aggregators.registry import DEFAULT_AGGREGATOR
from engine.events import EventKind, RunStopped
from engine.store.saved_labels import pool_key, save_labels
from engine.store.sql import utc_now
from engine.store.workspace import Store

RUNNING, DONE, STOPPED, FAILED = "running", "done", "stopped", "failed"


class JobStopped(RunStopped):
    """Raised inside a job's event sink when the expert asked to stop at once."""



@dataclass
class Job:
    """One background thread doing one piece of long work on one workspace."""

    id: str
    kind: str  # import | embed | evolve | labels | corpus
    workdir: Path
    params: dict[str, Any]
    status: str = RUNNING
    message: str = ""
    progress: float = 0.0
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False)  # what failed, for the UI to explain
    result: Any = None
    stop_requested: bool = False
    stop_now: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None  # time.monotonic() when it ended
    # called by a stop `now`: what cuts work that emits no event while it waits (an LLM call in flight)
    cancel_hooks: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def elapsed_s(self) -> float:
        """Seconds since the job started, or that it ran for once it has ended (for the live panels)."""
        return (self.finished_at if self.finished_at is not None else time.monotonic()) - self.started_at

    def stop(self, now: bool = False) -> None:
        """Ask the job to stop: after the current generation, or (`now`) at its next event, cutting what its cancel
        hooks can cut first (LLM calls in flight)."""
        self.stop_requested = True
        self.stop_now = self.stop_now or now
        if now:
            for hook in list(self.cancel_hooks):
                try:
                    hook()
                except Exception:  # noqa: BLE001 - a stop must not fail: the job ends at its next event anyway
                    pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the thread ends (tests, CLI); True when it has ended."""
        if self.thread is not None:
            self.thread.join(timeout)
        return not self.running


class JobContext:
    """What a job's work function gets: the store, an event sink and the stop flag."""

    def __init__(self, job: Job, store: Store):
        self.job = job
        self.store = store
        self.stage = (0.0, 0.0)  # the share of the bar the current stage's counted work fills (`begin_stage`)

    def begin_stage(self, low: float, high: float, message: str) -> None:
        """A stage of the job that fills the bar from `low` to `high` as its counted work (rows embedded, run in the
        sandbox) is done."""
        self.stage = (low, high)
        self.set_progress(low, message)

    def emit(self, kind: EventKind, payload: dict[str, Any]) -> None:
        """Record one progress event; raise JobStopped when the expert asked to stop at once."""
        self.store.add_event(self.job.id, kind, payload)
        if kind == EventKind.GENERATION_COMPLETE:
            self.set_progress(message=f"generation {payload.get('generation')} complete")
        elif kind in (EventKind.EMBEDDING, EventKind.EXECUTE_PROGRESS) and "total" in payload:
            what = "embedding texts" if kind == EventKind.EMBEDDING else f"sandbox on {payload.get('split', 'rows')}"
            # the bar follows the count within the current stage (it sat at 5% for a minute of embedding); a new
            # pass counting from 0 again does not move it back
            low, high = self.stage
            share = low + (high - low) * min(1.0, payload["done"] / max(1, payload["total"]))
            self.set_progress(max(self.job.progress, share), f"{what}: {payload['done']:,} / {payload['total']:,}")
        elif kind in (EventKind.AGENT_STARTED, EventKind.EXECUTING, EventKind.GENERATION_STARTED,
                      EventKind.AGGREGATING):
            detail = payload.get("agent") or payload.get("aggregator") or payload.get("split") or ""
            detail = detail or payload.get("generation") or ""
            self.set_progress(message=f"{kind.replace('_', ' ')} {detail}".strip())
        if self.job.stop_now:
            raise JobStopped()

    def set_progress(self, progress: float | None = None, message: str | None = None) -> None:
        if progress is not None:
            self.job.progress = float(progress)
        if message is not None:
            self.job.message = message
        self.store.upsert_job(self.job.id, progress=self.job.progress, message=self.job.message)

    def should_stop(self) -> bool:
        return self.job.stop_requested


Work = Callable[[JobContext], Any]


class JobRegistry:
    """Process-wide registry of jobs; at most one running job per (workspace, kind)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, kind: str, workdir: str | Path, work: Work, params: dict[str, Any] | None = None) -> Job:
        workdir = Path(workdir).resolve()
        with self._lock:
            busy = self.running(workdir, kind)
            if busy is not None:
                raise RuntimeError(f"a {kind} job is already running on this workspace ({busy.id})")
            job = Job(id=f"{kind}-{uuid.uuid4().hex[:10]}", kind=kind, workdir=workdir, params=dict(params or {}))
            self._jobs[job.id] = job
        try:
            store = Store.open(workdir)
            store.upsert_job(job.id, kind=kind, status=RUNNING, params=job.params, progress=0.0, message="starting")
            job.thread = threading.Thread(target=self._run, args=(job, work), name=f"evopool-{job.id}", daemon=True)
            job.thread.start()
        except BaseException:  # never started (the workspace locked by another process...): not left "running"
            with self._lock:
                self._jobs.pop(job.id, None)
            raise
        return job

    @staticmethod
    def _run(job: Job, work: Work) -> None:
        store = Store.open(job.workdir)  # this thread's own cursor
        ctx = JobContext(job, store)
        try:
            job.result = work(ctx)
            job.status = STOPPED if job.stop_requested else DONE
            job.progress = 1.0 if job.status == DONE else job.progress
            job.message = "stopped" if job.status == STOPPED else "finished"
        except Exception as err:  # a job's failure is data: recorded, shown, never a crashed server
            # a stop now ends it as stopped, whether its sink raised JobStopped or what the stop cut raised (a
            # cancelled LLM call)
            if isinstance(err, JobStopped) or job.stop_now:
                job.status, job.message = STOPPED, "stopped"
                store.add_event(job.id, EventKind.STOPPED, {"now": True})
            else:
                job.status, job.error, job.exception = FAILED, f"{type(err).__name__}: {err}", err
                job.message = "failed"
                store.add_event(job.id, EventKind.FAILED, {"error": job.error,
                                                          "trace": traceback.format_exc(limit=8)})
        job.finished_at = time.monotonic()
        store.upsert_job(job.id, status=job.status, progress=job.progress, message=job.message,
                         error=job.error, finished_at=utc_now())

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def running(self, workdir: str | Path, kind: str | None = None) -> Job | None:
        workdir = Path(workdir).resolve()
        for job in self._jobs.values():
            if job.running and job.workdir == workdir and (kind is None or job.kind == kind):
                return job
        return None

    def all_running(self, workdir: str | Path) -> list[Job]:
        """Every running job on the workspace, oldest first (an embedding and a generation run side by side)."""
        workdir = Path(workdir).resolve()
        return [job for job in list(self._jobs.values()) if job.running and job.workdir == workdir]

    def latest(self, workdir: str | Path, kind: str | None = None) -> Job | None:
        """The most recently started job of this process on the workspace (running or not)."""
        workdir = Path(workdir).resolve()
        found = [j for j in self._jobs.values() if j.workdir == workdir and (kind is None or j.kind == kind)]
        return found[-1] if found else None


REGISTRY = JobRegistry()


# ---- importing ---------------------------------------------------------------------------------------
def start_import(workdir: str | Path, frame: pd.DataFrame | None, opts: Any, *, dataset: str, source: str,
                 labels: tuple[str, ...] | None = None, wrench_folder: str | None = None,
                 read_problems: list | None = None, registry: JobRegistry = REGISTRY, embed_after: bool = True
                 ) -> Job:
    """Validate and import a table (or a WRENCH folder) in the background: 100K rows take seconds. Then (with
    `embed_after`) the rows are embedded by an `embed` job of their own.

    On success `job.result` is the ImportReport; on failure `job.exception` is the IngestError with its
    row-by-row problems.
    """
    from engine.ingest.importer import import_frame, import_path

    def work(ctx: JobContext) -> Any:
        ctx.set_progress(0.1, f"checking and importing {source}")

        def stage(share: float, what: str) -> None:
            ctx.set_progress(share, f"{what} of {source}")

        if wrench_folder:
            report = import_path(ctx.store, wrench_folder, opts, on_stage=stage)
        else:
            report = import_frame(ctx.store, frame, opts, dataset=dataset, source=source, labels=labels,
                                  read_problems=read_problems or (), on_stage=stage)
        if embed_after and registry.running(workdir, "embed") is None:
            start_embed(workdir, registry)  # its own job: the import is done, the rows are there to work on
        return report

    return registry.start("import", workdir, work, {"source": source, "dataset": dataset})


# ---- evolving -----------------------------------------------------------------------------------------
def start_evolve(workdir: str | Path, generations_more: int = 1, agents: str = DEFAULT_AGENTS, *,
                 proposer: Any = None, executor_factory: Callable[[], Any] | None = None, config: Any = None,
                 llm_overrides: Mapping[str, Any] | None = None, secrets: Mapping[str, Any] | None = None,
                 budget: Mapping[str, Any] | None = None, registry: JobRegistry = REGISTRY) -> Job:
    """Run `generations_more` more generations in a background thread.

    `proposer` / `executor_factory` replace the defaults (the agents named by `agents`, `default_executor()`).
    """
    from engine.evolve import EvolveConfig, evolve

    def work(ctx: JobContext) -> list[int]:
        store = ctx.store
        if not store.has_data():
            raise ValueError("the workspace holds no data yet: import a dataset first")
        start = store.last_complete_generation()
        target = start + int(generations_more)
        chosen = proposer if proposer is not None else _proposer(agents, store, llm_overrides, secrets, budget)
        if callable(getattr(chosen, "cancel", None)):  # Stop now cuts its calls in flight, not at their end
            ctx.job.cancel_hooks.append(chosen.cancel)

        def on_event(kind: EventKind, payload: dict[str, Any]) -> None:
            ctx.emit(kind, payload)
            if kind == EventKind.GENERATION_COMPLETE:
                ctx.set_progress((int(payload["generation"]) - start) / max(1, target - start))

        factory = executor_factory or _sandbox
        with factory() as executor:
            done = evolve(store, chosen, executor, target, config or EvolveConfig(), on_event, ctx.should_stop)
        return [g.number for g in done]

    params = {"agents": agents if proposer is None else getattr(proposer, "name", "custom"),
              "generations_more": int(generations_more)}
    return registry.start("evolve", workdir, work, params)


def _proposer(agents: str, store: Store, llm_overrides: Mapping[str, Any] | None,
              secrets: Mapping[str, Any] | None, budget: Mapping[str, Any] | None):
    """The studio's agents; its budget fields (the workspace's limits, kept for later runs) use 0 for "no limit"."""
    from engine.llm.costs import Budget

    given: dict[str, Any] = {k: (v if v else -1) for k, v in (budget or {}).items()}
    limits = Budget.for_workspace(store, **given)
    return make_proposer(agents, store, llm_overrides=llm_overrides, secrets=secrets, budget=limits)


def _sandbox():
    """Template annotators compiled in this process, all other code in the sandbox's workers."""
    from engine.apply.executor import default_executor

    return default_executor()


# ---- soft labels ---------------------------------------------------------------------------------------
def start_embed(workdir: str | Path, registry: JobRegistry = REGISTRY) -> Job:
    """Embed every row in the background as soon as it is imported (while the expert reads the data and evolves
    the pool), so the first soft labels need not wait minutes for it. Stopped, it keeps every round it saved; run
    again, it embeds only what is missing."""
    from engine.labeling import features

    def work(ctx: JobContext) -> int:
        _yield_the_cpu()
        ctx.begin_stage(0.0, 1.0, "embedding texts")
        return features.warm_embeddings(ctx.store, on_event=ctx.emit)

    return registry.start("embed", workdir, work, {})


EMBED_NICENESS = 5  # the embedding works ahead, so what the expert waits for goes first (10 starved it)


def _yield_the_cpu() -> None:
    """Lower this thread's scheduling priority (Linux schedules threads one by one): on a busy machine a generation
    the expert is watching runs at full speed (it took twice as long beside the embedding), and the embedding uses
    what is left. Nothing is lost where this is refused."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EMBED_NICENESS)
    except (AttributeError, OSError):
        pass


def _wait_for_embedding(ctx: JobContext, registry: JobRegistry) -> None:
    """Wait for an embedding job running on the workspace rather than embed the same texts twice at once."""
    embedding = registry.running(ctx.job.workdir, "embed")
    while embedding is not None and embedding.running:
        if ctx.job.stop_now:
            raise JobStopped()
        ctx.set_progress(message=f"waiting for the embeddings begun at import: {embedding.message}")
        embedding.wait(0.5)


def start_labels(workdir: str | Path, aggregator: str = DEFAULT_AGGREGATOR, *, compare: bool = True,
                 executor_factory: Callable[[], Any] | None = None, registry: JobRegistry = REGISTRY) -> Job:
    """Compute soft labels for every row (votes on all splits, embeddings, aggregator fit) in the background."""
    from engine.labeling import evaluate, fit

    def work(ctx: JobContext) -> Path:
        store = ctx.store
        if not store.pool_ids():
            raise ValueError("the pool is empty: evolve at least one generation first")
        key, pool = pool_key(store), store.pool_ids()
        _wait_for_embedding(ctx, registry)
        with (executor_factory or _sandbox)() as executor:
            ctx.begin_stage(0.02, 0.4 if compare else 0.98, f"labeling every row with {aggregator}")
            result = fit.soft_labels(store, executor, aggregator, on_event=ctx.emit)
            comparison = None
            if compare:
                # the labels first: the screen shows them (and their estimate) while the comparison, which took twice
                # as long as the labels on ChemProt, goes on
                save_labels(ctx.job.workdir, aggregator, result, None, key, pool)
                ctx.begin_stage(0.4, 0.98, "soft labels saved; comparing aggregators on dev (out-of-fold)")
                comparison = evaluate.compare_aggregators(store, executor, on_event=ctx.emit)
        return save_labels(ctx.job.workdir, aggregator, result, comparison, key, pool)

    return registry.start("labels", workdir, work, {"aggregator": aggregator, "compare": compare})


# ---- labeling a corpus outside the workspace -------------------------------------------------------
def cluster_command(workdir: str | Path, corpus: str, output: str, aggregator: str = DEFAULT_AGGREGATOR,
                    batch_size: int = 10_000, text_column: str = "text", id_column: str = "id") -> str:
    """The same run as a command for a Ray cluster (shown by the studio beside its local run)."""
    columns = "".join(f" --{flag} {shlex.quote(name)}" for flag, name, default in (
        ("text-column", text_column, "text"), ("id-column", id_column, "id")) if name != default)
    return (f"evopool label --workdir {shlex.quote(str(workdir))} --input {shlex.quote(corpus)} --output "
            f"{shlex.quote(str(output))} --aggregator {aggregator} --batch-size {batch_size}{columns} --engine ray "
            "--ray-address HEAD_NODE_IP:6379")


def start_corpus_label(workdir: str | Path, corpus: str, output: str | Path, aggregator: str = DEFAULT_AGGREGATOR,
                       *, batch_size: int = 10_000, text_column: str = "text", id_column: str = "id",
                       registry: JobRegistry = REGISTRY) -> Job:
    """Label a corpus file or glob into Parquet shards on the local engine (see `engine.corpus`), in the
    background; progress is rows done of the corpus's rows. The result is the run's manifest summary."""
    from engine.corpus.engines import Pace, label_corpus
    from engine.corpus.labeler import fit_labeler
    from engine.corpus.reading import check_batch_size, find_files, survey

    check_batch_size(batch_size)  # refused at the start button, not after the minutes of fitting

    def work(ctx: JobContext) -> dict:
        files = survey(find_files(corpus))
        ctx.set_progress(0.0, f"fitting {aggregator} on the dev rows")
        with _sandbox() as executor:
            labeler = fit_labeler(ctx.store, executor, aggregator, text_column=text_column, id_column=id_column)
        pace = Pace()

        def on_progress(done: int, total: int) -> None:
            rate, _ = pace.at(done, total)
            ctx.set_progress(done / max(total, 1), f"labeled {done:,} / {total:,} rows ({rate:,.0f} rows/s)")

        return label_corpus(labeler, files, output, batch_size=batch_size, on_progress=on_progress)

    return registry.start("corpus", workdir, work, {"corpus": corpus, "output": str(output), "aggregator": aggregator,
                                                    "batch_size": batch_size, "text_column": text_column,
                                                    "id_column": id_column})
