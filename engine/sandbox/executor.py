"""Running untrusted annotator code: never in this process, always in limited worker processes.

`SandboxExecutor` keeps a small pool of `python -m engine.sandbox.worker` processes (each handled through
`engine.sandbox.process.WorkerProcess`): requests go as JSON lines, replies come back as capped frames on a
pipe of their own, and the parent range-checks every vote. Each worker confines itself at start (see
`engine.sandbox.confine`; `containment()` reports each layer) and runs every annotator in a fresh fork. Work is
cut into (annotator, example chunk) tasks; each worker receives a chunk's examples once and then runs
annotators over it. Failures are data: a crash, timeout or bad return value becomes a counted fault with a
reason on that annotator, never an exception out of `run()`.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, Self

import numpy as np

from engine.domain import ABSTAIN, Annotator, ExecutionResult
from engine.sandbox.process import WorkerFailed, WorkerProcess, shutdown

Progress = Callable[[int, int], None]


class Executor(Protocol):
    """Runs annotators over examples; one result per annotator, votes are indices into `labels`."""

    def run(self, annotators: Sequence[Annotator], examples: Sequence[dict], labels: Sequence[str],
            on_progress: Progress | None = None) -> list[ExecutionResult]: ...


def jsonable(value: Any) -> Any:
    """Numpy scalars/arrays and other odd field values become plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


class ContainmentTooWeak(RuntimeError):
    """A layer that `require` names is off on this machine, so no annotator may run."""


def required_layers(require: Iterable[str] | None) -> frozenset[str]:
    if require is None:
        require = [part for part in os.environ.get("EVOPOOL_SANDBOX_REQUIRE", "").split(",") if part.strip()]
    return frozenset(part.strip() for part in require)


def weak_layers(report: dict[str, str], require: frozenset[str]) -> list[str]:
    """The required layers that are not on ("all": every reported layer)."""
    names = list(report) if "all" in require else sorted(require)
    return [f"{name} ({report.get(name, 'off: not reported')})" for name in names
            if not report.get(name, "").startswith("on")]


def _check_votes(reply: dict, size: int, n_labels: int) -> None:
    """The parent trusts no worker: one int per example, each an abstention or a label index."""
    votes = reply.get("votes")
    if not isinstance(votes, list) or len(votes) != size:
        raise WorkerFailed(f"worker returned {len(votes) if isinstance(votes, list) else 'no'} votes for {size} "
                           "examples")
    if not all(type(v) is int and ABSTAIN <= v < n_labels for v in votes):
        raise WorkerFailed("worker returned votes outside the label set")
    if type(reply.get("faults")) is not int or type(reply.get("stopped")) is not bool:
        raise WorkerFailed("worker returned a malformed reply")


CHUNK_CHARS = 8 << 20  # a chunk's examples as JSON: the zygote holds them, every run's child may copy them
FIRST_CHUNK_ROWS = 4096  # a probe: an annotator that runs away is stopped there, on a small budget, and skipped


def _chunk_bounds(sizes: list[int], max_rows: int, max_chars: int) -> list[tuple[int, int]]:
    """[start, end) chunks of at most `max_rows` rows (the first at most FIRST_CHUNK_ROWS) and, unless one row
    alone is bigger, `max_chars`: few chunks, because each (annotator, chunk) run costs a fork."""
    bounds, start, chars = [], 0, 0
    for i, size in enumerate(sizes):
        limit = min(max_rows, FIRST_CHUNK_ROWS) if not bounds else max_rows
        if i > start and (i - start >= limit or chars + size > max_chars):
            bounds.append((start, i))
            start, chars = i, 0
        chars += size + 1
    if sizes:
        bounds.append((start, len(sizes)))
    return bounds


class _RunState:
    """What one `run()` call shares between its worker threads."""

    def __init__(self, run_id: int, examples: Sequence[dict], labels: list[str], batch_size: int):
        self.run_id = run_id
        rows = [json.dumps(example, default=jsonable) for example in examples]
        self.chunks = _chunk_bounds([len(row) for row in rows], batch_size, CHUNK_CHARS)
        head = json.dumps(labels)
        self.loads = [
            f'{{"op":"load","offset":{s},"labels":{head},"examples":[{",".join(rows[s:e])}]}}\n'.encode("utf-8")
            for s, e in self.chunks
        ]
        self.n_labels = len(labels)
        self.stopped_at: dict[int, int] = {}  # annotator index -> first chunk where its run was stopped
        self.lock = threading.Lock()

    def mark_stopped(self, ai: int, ci: int) -> None:
        with self.lock:
            self.stopped_at[ai] = min(ci, self.stopped_at.get(ai, ci))

    def is_stopped_before(self, ai: int, ci: int) -> bool:
        with self.lock:
            return self.stopped_at.get(ai, ci) < ci


class SandboxExecutor:
    """The real `Executor`: a reusable pool of limited worker processes.

    Time budget per annotator per chunk of `batch_size` examples: `time_budget_s + per_example_s * len(chunk)`
    CPU seconds, enforced by an alarm in the worker, by RLIMIT_CPU, and (wall clock, 2x budget + `grace_s`)
    by the parent, which kills and replaces a worker that does not answer.
    """

    def __init__(self, workers: int = 2, time_budget_s: float = 2.0, per_example_s: float = 0.002,
                 memory_mb: int = 512, batch_size: int = 16384, grace_s: float = 5.0,
                 load_timeout_s: float = 60.0,
                 require: Iterable[str] | None = None, unchecked: bool = False, tree_memory_mb: int | None = None):
        """`require`: containment layers that must be on, else no annotator runs (default: the
        EVOPOOL_SANDBOX_REQUIRE variable, comma-separated, or "all"). `unchecked` is for the containment tests
        only: the worker skips its code check and gives annotators full builtins, so the OS layers hold alone.
        `tree_memory_mb`: each worker's cgroup caps its whole process tree there (default `memory_mb`)."""
        if workers < 1 or batch_size < 1:
            raise ValueError("workers and batch_size must be at least 1")
        self.require = required_layers(require)
        self.unchecked = unchecked
        self.n_workers = workers
        self.time_budget_s = time_budget_s
        self.per_example_s = per_example_s
        self.memory_mb = memory_mb
        self.tree_memory_mb = tree_memory_mb
        self.batch_size = batch_size
        self.grace_s = grace_s
        self.load_timeout_s = load_timeout_s
        self._workers: list[WorkerProcess | None] = [None] * workers
        self._lock = threading.Lock()
        self._run_id = 0
        self._finalizer = weakref.finalize(self, shutdown, self._workers)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes; a later `run()` starts fresh ones."""
        with self._lock:
            shutdown(self._workers)

    def run(self, annotators: Sequence[Annotator], examples: Sequence[dict], labels: Sequence[str],
            on_progress: Progress | None = None) -> list[ExecutionResult]:
        """Votes of every annotator on every example. `on_progress(done, total)` counts annotator-example
        pairs and is called from this thread."""
        annotators = list(annotators)
        n = len(examples)
        if not annotators:
            return []
        if n == 0:
            return [ExecutionResult(a.id, np.full(0, ABSTAIN, dtype=np.int64)) for a in annotators]
        with self._lock:
            self._run_id += 1
            state = _RunState(self._run_id, examples, [str(label) for label in labels], self.batch_size)
            tasks: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
            for ci in range(len(state.chunks)):  # chunk-major: each worker loads each chunk at most once
                for ai in range(len(annotators)):
                    tasks.put((ci, ai))
            outcomes = self._execute(annotators, state, tasks, on_progress)
        return [self._assemble(ai, a, state, outcomes) for ai, a in enumerate(annotators)]

    def _execute(self, annotators: list[Annotator], state: _RunState, tasks: queue.SimpleQueue,
                 on_progress: Progress | None) -> dict[tuple[int, int], dict]:
        n_tasks = len(state.chunks) * len(annotators)
        results: queue.SimpleQueue = queue.SimpleQueue()
        threads = [threading.Thread(target=self._drain, args=(slot, annotators, state, tasks, results),
                                    daemon=True) for slot in range(min(self.n_workers, n_tasks))]
        for thread in threads:
            thread.start()
        outcomes: dict[tuple[int, int], dict] = {}
        total, done, failure = len(annotators) * state.chunks[-1][1], 0, None
        try:
            while len(outcomes) < n_tasks and failure is None:
                item = results.get()
                if isinstance(item, BaseException):
                    failure = item
                    break
                ci, ai, outcome = item
                outcomes[(ci, ai)] = outcome
                done += state.chunks[ci][1] - state.chunks[ci][0]
                if on_progress is not None:
                    on_progress(done, total)
        finally:
            if failure is not None or len(outcomes) < n_tasks:
                while not tasks.empty():  # let the threads finish their current task and stop
                    tasks.get_nowait()
            for thread in threads:
                thread.join()
        if failure is not None:
            raise RuntimeError(f"sandbox infrastructure failure: {failure}") from failure
        return outcomes

    def _drain(self, slot: int, annotators: list[Annotator], state: _RunState, tasks: queue.SimpleQueue,
               results: queue.SimpleQueue) -> None:
        while True:
            try:
                ci, ai = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((ci, ai, self._run_task(slot, annotators[ai], ai, ci, state)))
            except BaseException as exc:  # noqa: BLE001 - not the annotator's fault: re-raised by run()
                results.put(exc)
                return

    def _worker(self, slot: int) -> WorkerProcess:
        worker = self._workers[slot]
        if worker is None or not worker.alive():
            if worker is not None:
                worker.close()
            worker = self._workers[slot] = WorkerProcess(self.memory_mb, self.unchecked, self.tree_memory_mb)
        missing = weak_layers(worker.containment, self.require)  # also for a worker containment() started
        if missing:
            raise ContainmentTooWeak(f"required sandbox layers are off: {'; '.join(missing)}")
        return worker

    def containment(self) -> dict[str, str]:
        """Each containment layer of this machine's workers, as "on: what" or "off: why" (starts a worker)."""
        with self._lock:
            worker = self._workers[0]
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = self._workers[0] = WorkerProcess(self.memory_mb, self.unchecked, self.tree_memory_mb)
            return dict(worker.containment)

    def _load(self, slot: int, state: _RunState, ci: int) -> WorkerProcess:
        key = (state.run_id, ci)
        worker = self._worker(slot)
        if worker.chunk_key == key:
            return worker
        try:
            worker.request(state.loads[ci], self.load_timeout_s)
        except WorkerFailed:
            worker = self._worker(slot)  # one retry on a fresh process, then it is an infrastructure failure
            worker.request(state.loads[ci], self.load_timeout_s)
        worker.chunk_key = key
        return worker

    def _run_task(self, slot: int, annotator: Annotator, ai: int, ci: int, state: _RunState) -> dict:
        start, end = state.chunks[ci]
        size = end - start
        if state.is_stopped_before(ai, ci):
            return {"votes": None, "faults": size, "first_error": None, "stopped": True, "seconds": 0.0}
        worker = self._load(slot, state, ci)
        budget = self.time_budget_s + self.per_example_s * size
        wall = 2 * budget + self.grace_s / 2  # the worker's own deadline comes first and keeps the worker
        payload = (json.dumps({"op": "run", "source": annotator.source, "budget_s": budget, "wall_s": wall})
                   + "\n").encode()
        began = time.perf_counter()
        try:
            reply = worker.run(payload, 2 * budget + self.grace_s, cap=4096 + 16 * size)
            _check_votes(reply, size, state.n_labels)
        except WorkerFailed as exc:
            worker.kill()
            text = f"timeout after {budget:.1f}s: {exc}" if exc.timed_out else str(exc)
            reply = {"votes": None, "faults": size, "first_error": f"{text} (examples {start}-{end - 1})",
                     "stopped": True, "seconds": time.perf_counter() - began}
        if reply["stopped"]:
            state.mark_stopped(ai, ci)
        return reply

    @staticmethod
    def _assemble(ai: int, annotator: Annotator, state: _RunState,
                  outcomes: dict[tuple[int, int], dict]) -> ExecutionResult:
        """Stitch chunk outcomes together; once a run was stopped, its later chunks are void faults."""
        n = state.chunks[-1][1]
        votes = np.full(n, ABSTAIN, dtype=np.int64)
        faults, first_error, seconds = 0, None, 0.0
        stop = state.stopped_at.get(ai)
        for ci, (start, end) in enumerate(state.chunks):
            outcome = outcomes[(ci, ai)]
            if stop is not None and ci > stop:
                faults += end - start
                continue
            if outcome["votes"] is not None:
                votes[start:end] = outcome["votes"]
            faults += int(outcome["faults"])
            first_error = first_error or outcome["first_error"]
            seconds += float(outcome["seconds"])
        return ExecutionResult(annotator.id, votes, faults=faults, first_error=first_error, seconds=seconds)
