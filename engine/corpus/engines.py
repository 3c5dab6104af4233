"""Where the batches are labeled: in this process (`local`, never imports ray) or on a Ray cluster (`ray`).

Both engines hand every batch to the same `ShardWriter` (one sandbox each), which labels it with the shipped
labeler and writes its shard; only the driver reads the corpus and writes the manifest. On Ray each writer
is an actor holding one CPU; a killed actor is restarted and its batch retried (the shard rename makes a
retry harmless). The output folder must be one every node can write (a shared file system).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.apply.executor import default_executor
from engine.corpus.labeler import Labeler
from engine.corpus.reading import CorpusBatch, CorpusError, CorpusFile, check_batch_size, file_names, iter_batches
from engine.corpus.shards import (
    OutputError,
    ShardRecord,
    prepare,
    shard_name,
    unify_shards,
    write_manifest,
    write_shard,
)

ENGINES = ("local", "ray")
Progress = Callable[[int, int], None]  # (rows done, rows in the corpus)
RAY_MISSING = ("the ray engine needs Ray, which is not installed: pip install -e '.[ray]' "
               "(or pip install 'ray>=2.60'), or use --engine local")


class EngineUnavailable(Exception):
    """The engine asked for cannot run here (Ray is not installed)."""


def require_ray():
    """The `ray` module, or EngineUnavailable saying how to install it."""
    try:
        import ray
    except ImportError:
        raise EngineUnavailable(RAY_MISSING) from None
    return ray


class ShardWriter:
    """Labels batches and writes their shards: one sandbox (worker processes) per writer."""

    def __init__(self, labeler: Labeler, output: str, sandbox_workers: int = 1):
        self.labeler = labeler
        self.output = Path(output)
        self.executor = default_executor(workers=sandbox_workers)

    def write(self, batch: CorpusBatch) -> ShardRecord:
        labeled = self.labeler.label(batch, self.executor)
        record = ShardRecord(batch.index, shard_name(batch.index), len(labeled.frame), batch.source,
                             batch.first_row, labeled.faults)
        return write_shard(self.output, labeled.frame, record)

    def pid(self) -> int:
        import os
        return os.getpid()

    def close(self) -> None:
        self.executor.close()


def label_corpus(labeler: Labeler, files: list[CorpusFile], output: str | Path, *, engine: str = "local",
                 batch_size: int = 10_000, ray_address: str | None = None, workers: int | None = None,
                 on_progress: Progress | None = None, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Label every row of `files` into `output`; returns the manifest. Resumes a run killed in the same folder.

    `workers`: local: sandbox processes (default 2); ray: writer actors (default: the cluster's CPUs).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    check_batch_size(batch_size)  # before `_run.json`: a folder holding a run that cannot start refuses the rerun
    output = Path(output).resolve()  # Ray actors resolve a relative path against their own working folder
    # ids name a row by its file: two files of one name in different folders must not share them
    labeler = replace(labeler, provenance={**labeler.provenance, "file_names": file_names(files)})
    run = {**(run or {}), "inputs": [(str(f.path), f.rows, f.path.stat().st_size) for f in files],
           "batch_size": batch_size, "aggregator": labeler.aggregator, "made_by": labeler.made_by,
           "pool": labeler.provenance.get("pool"), "embedder": labeler.embedder, "labels": list(labeler.labels),
           # the fitted model's other inputs: a rerun with another seed or after the expert labeled rows is another run
           "seed": labeler.provenance.get("seed"), "dev_labels": labeler.provenance.get("dev_labels"),
           "workspace": labeler.provenance.get("workspace"), "generation": labeler.provenance.get("generation"),
           "text_column": labeler.text_column, "threshold": labeler.threshold,
           # only when named: a run begun before the option keeps its fingerprint, and resumes
           **({"id_column": labeler.id_column} if labeler.id_column != "id" else {})}
    done = prepare(output, run)
    total = sum(f.rows for f in files)
    counted = _Counter(total, on_progress, sum(s.rows for s in done.values()))
    todo = (b for b in iter_batches(files, batch_size) if b.index not in done)
    began = time.perf_counter()
    if engine == "local":
        new = _run_local(labeler, output, todo, counted, workers or 2)
        info: dict[str, Any] = {"workers": workers or 2}
    else:
        new, info = _run_ray(labeler, output, todo, counted, ray_address, workers)
    seconds = time.perf_counter() - began
    shards = [*done.values(), *new]
    rows_now = sum(s.rows for s in new)
    extra = {"engine": engine, **info, "labeler": {"aggregator": labeler.aggregator, "made_by": labeler.made_by,
                                                  "embedder": labeler.embedder, **labeler.provenance},
             "labels": list(labeler.labels), "inputs": [{"path": str(f.path), "rows": f.rows} for f in files],
             "resumed_shards": len(done), "seconds": round(seconds, 3),
             "rows_per_s": round(rows_now / seconds, 1) if seconds > 0 else None, "batch_size": batch_size}
    unify_shards(output, shards)  # a resumed run's earlier shards too: the manifest lists one table
    manifest_path = write_manifest(output, shards, extra)
    return {"manifest": str(manifest_path), "rows": sum(s.rows for s in shards), "shards": len(shards), **extra}


class Pace:
    """Rows per second and time left of a corpus run, from its first progress report on: a resumed run starts at
    the rows its earlier shards hold, which this run did not label (counted in, they made 592,677 rows/s)."""

    def __init__(self) -> None:
        self.start: tuple[float, int] | None = None

    def at(self, done: int, total: int) -> tuple[float, float | None]:
        """(rows/s, seconds left or None while unknown) with `done` of `total` rows labeled now."""
        now = time.monotonic()
        if self.start is None:
            self.start = (now, done)
        began, first = self.start
        rate = (done - first) / (now - began) if now > began and done > first else 0.0
        return rate, ((total - done) / rate if rate else None)


class _Counter:
    def __init__(self, total: int, on_progress: Progress | None, done: int):
        self.total, self.on_progress, self.done = total, on_progress, done
        self.report()

    def add(self, rows: int) -> None:
        self.done += rows
        self.report()

    def report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.done, max(self.total, self.done))


def _run_local(labeler: Labeler, output: Path, batches: Iterator[CorpusBatch], counted: _Counter,
               workers: int) -> list[ShardRecord]:
    writer = ShardWriter(labeler, str(output), sandbox_workers=workers)
    try:
        out = []
        for batch in batches:
            out.append(writer.write(batch))
            counted.add(out[-1].rows)
        return out
    finally:
        writer.close()


def _run_ray(labeler: Labeler, output: Path, batches: Iterator[CorpusBatch], counted: _Counter,
             address: str | None, workers: int | None) -> tuple[list[ShardRecord], dict[str, Any]]:
    ray = require_ray()
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            _check_reachable(address)  # ray.init retries an unreachable address for minutes, saying nothing
        ray.init(address=address or "local", num_cpus=None if address else (workers or 2), include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False, configure_logging=True)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n_actors = max(1, min(workers or cpus, cpus))
        remote_writer = ray.remote(num_cpus=1, max_restarts=2, max_task_retries=2)(ShardWriter)
        labeler_ref = ray.put(labeler)
        actors = [remote_writer.remote(labeler_ref, str(output)) for _ in range(n_actors)]
        idle, in_flight, out = list(actors), dict[Any, Any](), []
        nodes = len({n["NodeID"] for n in ray.nodes() if n.get("Alive")})

        def collect_one() -> None:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            actor = in_flight.pop(ready[0])
            try:
                out.append(ray.get(ready[0]))
            except ray.exceptions.RayTaskError as err:  # the worker's own error, not Ray's wrapping of it
                if isinstance(err.cause, (CorpusError, OutputError, ValueError)):
                    raise err.cause from None
                raise
            except ray.exceptions.RayActorError as err:
                raise EngineUnavailable("a Ray worker died three times on one batch (out of memory, or killed); the "
                                        "complete shards are kept: run the same command again to resume") from err
            counted.add(out[-1].rows)
            idle.append(actor)

        for batch in batches:
            while not idle:
                collect_one()
            actor = idle.pop()
            in_flight[actor.write.remote(batch)] = actor
        while in_flight:
            collect_one()
        ray.get([actor.close.remote() for actor in actors])  # stop each sandbox before its actor goes
        for actor in actors:
            ray.kill(actor)
        return out, {"workers": n_actors, "ray_nodes": nodes, "ray_address": address or "local"}
    finally:
        if started_here:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """A quick TCP connect to a `host:port` (or `ray://host:port`) cluster address; `auto` and the like pass."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise EngineUnavailable(f"cannot reach the Ray cluster at {address}: {err}") from None
