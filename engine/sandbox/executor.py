"""Running untrusted annotator code: never in this process, always in limited worker processes.

`SandboxExecutor` keeps a small pool of `python -m engine.sandbox.worker` processes (each handled through
`engine.sandbox.process.WorkerProcess`): requests go as JSON lines, replies come back as capped frames on a
pipe of their own, and the parent range-checks every vote. Each worker confines itself at start (see
`engine.sandbox.confine`; `containment()` reports each layer) and runs every annotator in a fresh fork. Work is
cut into (annotator, example chunk) tasks; a chunk goes to as few workers as possible (_RunState), each of which
receives its examples once and then runs annotators over it; votes come back packed (engine.sandbox.wire).
Failures are data: a crash, timeout or bad return value becomes a counted fault with a reason on that
annotator, never an exception out of `run()`.
"""
from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, Self

import numpy as np

from engine.domain import ABSTAIN, Annotator, ExecutionResult
from engine.sandbox.checks import clean_text
from engine.sandbox.process import WorkerFailed, WorkerProcess, shutdown
from engine.sandbox.wire import unpack_votes, vote_code

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


def _honest_seconds(reported: object, elapsed: float) -> float:
    """The run time a child reports, which it may forge: a finite number, at least 0 and at most what the parent
    saw the run take."""
    if type(reported) not in (int, float):  # type(): not a bool
        return 0.0
    try:  # an int of 4,000 digits is valid JSON, and too big for a float
        seconds = float(reported)  # type: ignore[arg-type]  # an int or a float: checked above
    except OverflowError:
        return 0.0
    return min(max(seconds, 0.0), elapsed) if math.isfinite(seconds) else 0.0


def _check_votes(reply: dict, size: int, n_labels: int) -> None:
    """The parent trusts no worker: one vote per example, each an abstention or a label index. The packed votes
    (engine.sandbox.wire) are replaced by an int64 array."""
    try:
        votes = np.frombuffer(unpack_votes(reply.get("votes"), n_labels), dtype=vote_code(n_labels)).astype(np.int64)
    except (ValueError, UnicodeError):
        raise WorkerFailed("worker returned malformed votes") from None
    if len(votes) != size:
        raise WorkerFailed(f"worker returned {len(votes)} votes for {size} examples")
    if size and (votes.min() < ABSTAIN or votes.max() >= n_labels):
        raise WorkerFailed("worker returned votes outside the label set")
    if type(reply.get("faults")) is not int or type(reply.get("stopped")) is not bool:
        raise WorkerFailed("worker returned a malformed reply")
    reply["votes"] = votes


CHUNK_CHARS = 8 << 20  # a chunk's examples as JSON: a worker's holder holds them, every run's child may copy them
FIRST_CHUNK_ROWS = 4096  # a probe: an annotator that runs away is stopped there, on a small budget, and skipped
_ENCODER = json.JSONEncoder(default=jsonable)  # one encoder for every row (json.dumps builds one per call)


class _RunState:
    """What one `run()` call shares between its threads: the chunks, encoded as they are needed, and the tasks.

    An encoder thread turns the examples into load requests chunk by chunk (at most `batch_size` rows, the first
    at most FIRST_CHUNK_ROWS, and unless one row alone is bigger CHUNK_CHARS of JSON), so the workers start on the
    first chunk while the rest is encoded. A task is (chunk, annotator). A worker takes the tasks of the chunk it
    holds first, then a chunk no other worker holds, and only then shares one: each chunk is sent to and parsed by
    as few workers as possible. An annotator runs on later chunks only once its run on the first (the probe) is
    over, as when tasks went strictly chunk by chunk."""

    def __init__(self, run_id: int, examples: Sequence[dict], labels: list[str], n_annotators: int,
                 batch_size: int):
        self.run_id = run_id
        self.examples = examples
        self.batch_size = batch_size
        self.n_annotators = n_annotators
        self.head = json.dumps(labels)
        self.n_labels = len(labels)
        self.chunks: list[tuple[int, int]] = []
        self.loads: list[bytes] = []
        self.pending: list[list[int]] = []  # per chunk: annotators not handed out yet, in order
        self.holder: dict[int, int] = {}  # worker slot -> the chunk it was last given a task of
        self.probed: set[int] = set()  # annotators whose run on chunk 0 is over
        self.encoded = False
        self.failure: BaseException | None = None  # the encoder's error, raised by run() as it is
        self.cancelled = False
        self.stopped_at: dict[int, int] = {}  # annotator index -> first chunk where its run was stopped
        self.lock = threading.Condition()

    def encode(self) -> None:
        """The encoder thread: append each chunk's load request as soon as it is encoded."""
        try:
            n, start, row = len(self.examples), 0, None
            while start < n and not self.cancelled:
                limit = min(self.batch_size, FIRST_CHUNK_ROWS) if not self.chunks else self.batch_size
                rows: list[str] = []
                chars, end = 0, start
                while end < n and end - start < limit:
                    row = row if row is not None else _ENCODER.encode(self.examples[end])
                    if rows and chars + len(row) > CHUNK_CHARS:
                        break  # the row opens the next chunk
                    rows.append(row)
                    chars, end, row = chars + len(row) + 1, end + 1, None
                load = (f'{{"op":"load","offset":{start},"labels":{self.head},"examples":[{",".join(rows)}]}}\n'
                        .encode("utf-8"))
                with self.lock:
                    self.chunks.append((start, end))
                    self.loads.append(load)
                    self.pending.append(list(range(self.n_annotators)))
                    self.lock.notify_all()
                start = end
        except BaseException as exc:  # noqa: BLE001 - e.g. a circular example: run() raises it
            with self.lock:
                self.failure = exc
                self.cancelled = True
        finally:
            with self.lock:
                self.encoded = True
                self.lock.notify_all()

    def next_task(self, slot: int) -> tuple[int, int] | None:
        """The next (chunk, annotator) for the worker in `slot`, waiting for the encoder or for probes as
        needed; None when nothing is left (or the run was cancelled)."""
        with self.lock:
            while not self.cancelled:
                held = self.holder.get(slot)
                others = {ci for s, ci in self.holder.items() if s != slot}
                order = ([held] if held is not None else []) + \
                    [ci for ci in range(len(self.chunks)) if ci != held and ci not in others] + sorted(others)
                for ci in order:
                    ai = next((ai for ai in self.pending[ci] if ci == 0 or ai in self.probed), None)
                    if ai is not None:
                        self.pending[ci].remove(ai)
                        self.holder[slot] = ci
                        return ci, ai
                if self.encoded and not any(self.pending):
                    return None
                self.lock.wait()
            return None

    def finished(self, ci: int, ai: int) -> None:
        with self.lock:
            if ci == 0:
                self.probed.add(ai)
                self.lock.notify_all()

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            self.lock.notify_all()

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
            state = _RunState(self._run_id, examples, [str(label) for label in labels], len(annotators),
                              self.batch_size)
            outcomes = self._execute(annotators, state, on_progress)
        return [self._assemble(ai, a, state, outcomes) for ai, a in enumerate(annotators)]

    def _execute(self, annotators: list[Annotator], state: _RunState,
                 on_progress: Progress | None) -> dict[tuple[int, int], dict]:
        results: queue.SimpleQueue = queue.SimpleQueue()
        encoder = threading.Thread(target=state.encode, daemon=True)
        threads = [threading.Thread(target=self._drain, args=(slot, annotators, state, results), daemon=True)
                   for slot in range(self.n_workers)]
        encoder.start()
        for thread in threads:
            thread.start()
        outcomes: dict[tuple[int, int], dict] = {}
        total, done, running, failure = len(annotators) * len(state.examples), 0, len(threads), None
        try:
            while running:
                item = results.get()
                if item is None:  # a thread found nothing left to do
                    running -= 1
                elif isinstance(item, BaseException):
                    failure = failure or item
                    state.cancel()  # the other threads finish their current task and stop
                else:
                    ci, ai, outcome = item
                    outcomes[(ci, ai)] = outcome
                    done += state.chunks[ci][1] - state.chunks[ci][0]
                    if on_progress is not None:
                        on_progress(done, total)
        finally:
            state.cancel()
            for thread in threads:
                thread.join()
            encoder.join()
        if state.failure is not None:
            raise state.failure
        if failure is not None:
            raise RuntimeError(f"sandbox infrastructure failure: {failure}") from failure
        return outcomes

    def _drain(self, slot: int, annotators: list[Annotator], state: _RunState, results: queue.SimpleQueue) -> None:
        try:
            while (task := state.next_task(slot)) is not None:
                ci, ai = task
                outcome = self._run_task(slot, annotators[ai], ai, ci, state)
                state.finished(ci, ai)
                results.put((ci, ai, outcome))
        except BaseException as exc:  # noqa: BLE001 - not the annotator's fault: re-raised by run()
            results.put(exc)
        results.put(None)

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
            worker.load(state.loads[ci], self.load_timeout_s)
        except WorkerFailed:
            worker = self._worker(slot)  # one retry on a fresh process, then it is an infrastructure failure
            worker.load(state.loads[ci], self.load_timeout_s)
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
        began = time.perf_counter()
        try:
            reply = worker.run(annotator.source, budget, wall, 2 * budget + self.grace_s, cap=4096 + 16 * size)
            _check_votes(reply, size, state.n_labels)
            reply["seconds"] = _honest_seconds(reply.get("seconds"), time.perf_counter() - began)
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
            seconds += outcome["seconds"]
        # the error text is the annotator's own (an exception it raised): storable whatever characters it holds
        first_error = clean_text(str(first_error)) if first_error is not None else None
        return ExecutionResult(annotator.id, votes, faults=faults, first_error=first_error, seconds=seconds)
