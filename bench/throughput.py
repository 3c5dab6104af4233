"""Throughput: the pool the offline agents evolve on ChemProt, applied to N rows by five appliers in one run.

The pool is evolved once (ChemProt from ../shared/data, dev 500 rows, 5 generations, offline agents, seed 0) and
kept in `bench/results/throughput_pool.json` (the annotators' sources), so every run applies the same annotators;
`--fresh-pool` evolves it again. The rows are the workspace's ChemProt pool rows (train, plus the valid rows not
drawn into dev: 13,968) as the workers see them (text, entity1, entity2, span1, span2), cached in
`bench/results/tmp/throughput_rows.json`, repeated up to `--rows`. Each applier runs in its own child process
(so its peak RSS is its own) on the same annotators and rows:

  compiled        the compiled annotator path (`CompiledExecutor`, from branch h-fast; skipped when absent)
  sandbox         `SandboxExecutor` (confined worker processes, `--workers`), what `evopool` uses
  snorkel-lf      Snorkel's `LFApplier` over the row dicts (each annotator wrapped as a `LabelingFunction`)
  snorkel-pandas  Snorkel's `PandasLFApplier` over a DataFrame of the rows (the LF gets a pandas Series)
  bare-loop       each annotator's source exec'd in this process, `annotate` called per row (trusted: our pool)

`seconds` is the apply time only (executor start-up included; imports, reading the pool and building the row list
or DataFrame excluded). `checksum` is a SHA-256 of the (rows, annotators) int32 vote matrix, ABSTAIN = -1: every
applier must give the same one. `peak_rss_mb` is the child's `ru_maxrss` plus the largest of its children's
(`resource.getrusage`: the sandbox's workers are its children), so it includes the rows themselves.

    python bench/throughput.py [--rows 10000 100000 1000000] [--appliers sandbox bare-loop ...] [--json]
                               [--skip-slow-above 100000] [--workers 2] [--out bench/results/throughput]

Snorkel is the optional `bench` extra (`pip install -e '.[bench]'`). At 1M rows Snorkel's appliers take many
minutes and GiBs (they build Python lists per vote); `--skip-slow-above N` (default 100000) skips them above N
rows and records that they were skipped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import commit, machine  # noqa: E402
from engine.domain import ABSTAIN, Annotator  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
POOL_FILE = ROOT / "bench" / "results" / "throughput_pool.json"
ROWS_FILE = ROOT / "bench" / "results" / "tmp" / "throughput_rows.json"
WORKDIR = ROOT / "bench" / "results" / "tmp" / "throughput-chemprot"
APPLIERS = ("compiled", "sandbox", "snorkel-lf", "snorkel-pandas", "bare-loop")
SLOW = ("snorkel-lf", "snorkel-pandas")  # skipped above --skip-slow-above rows


# ---- the pool -------------------------------------------------------------------------------------------
def chemprot_workspace(workdir: Path = WORKDIR, seed: int = 0):
    """A fresh workspace with ChemProt imported as bench/quality.py imports it (dev 500 rows)."""
    import shutil

    from engine.ingest.importer import IngestOptions, import_path
    from engine.store.workspace import Store

    if not (SHARED / "chemprot").is_dir():
        sys.exit(f"no ChemProt at {SHARED / 'chemprot'}: this benchmark needs ../shared/data")
    if workdir.exists():
        shutil.rmtree(workdir)
    store = Store.open(workdir)
    import_path(store, SHARED / "chemprot", IngestOptions(dev_size=500, seed=seed))
    return store


def save_rows(store, path: Path = ROWS_FILE) -> None:
    """The pool split's rows as the sandbox's workers receive them (text plus the other fields)."""
    frame = store.examples_frame("pool")
    rows = [{**f, "text": t} for f, t in zip(frame["fields"], frame["text"], strict=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))


def evolve_pool(generations: int = 5, seed: int = 0) -> dict[str, Any]:
    """Evolve on ChemProt the way bench/quality.py does; return the pool's annotators and the labels."""
    from engine.agents.offline.proposer import OfflineProposer
    from engine.evolve import EvolveConfig, evolve
    from engine.sandbox.executor import SandboxExecutor
    from engine.store.workspace import Store

    store = chemprot_workspace(seed=seed)
    started = time.monotonic()
    with SandboxExecutor() as executor:
        evolve(store, OfflineProposer(), executor, generations, EvolveConfig(seed=seed))
    save_rows(store)
    pool = store.annotators(store.pool_ids())
    out = {"dataset": "chemprot", "generations": generations, "seed": seed, "commit": commit(),
           "evolve_s": round(time.monotonic() - started, 1), "labels": list(store.load_task().labels),
           "annotators": [{"id": a.id, "name": a.name, "source": a.source, "agent": a.agent} for a in pool]}
    Store.close_all()
    return out


def ensure_rows(path: Path = ROWS_FILE) -> None:
    """Import ChemProt (no evolving) to cache its pool rows when the cache is missing."""
    from engine.store.workspace import Store

    if not path.exists():
        save_rows(chemprot_workspace())
        Store.close_all()


def load_pool(path: Path = POOL_FILE, rows_path: Path = ROWS_FILE) -> tuple[list[Annotator], list[str], list[dict]]:
    data = json.loads(path.read_text())
    annotators = [Annotator(a["id"], a["name"], a["source"], a["agent"], 0) for a in data["annotators"]]
    return annotators, data["labels"], json.loads(rows_path.read_text())


def repeat_rows(base: list[dict], rows: int) -> list[dict]:
    """ChemProt's train rows repeated up to `rows` (the same dict objects: the rows cost little memory)."""
    return [base[i % len(base)] for i in range(rows)]


# ---- the appliers ---------------------------------------------------------------------------------------
def annotate_functions(annotators: list[Annotator]) -> list[Callable[[Any], Any]]:
    """Each annotator's `annotate`, exec'd in this process with the full builtins (trusted code: our pool)."""
    out = []
    for a in annotators:
        namespace: dict[str, Any] = {"__name__": "annotator"}
        exec(compile(a.source, f"<{a.name}>", "exec"), namespace)  # noqa: S102 - the bench's own pool
        out.append(namespace["annotate"])
    return out


def vote_of(annotate: Callable[[Any], Any], label_index: dict[str, int]) -> Callable[[Any], int]:
    """A label index or ABSTAIN for one row, as the sandbox's worker maps it (a raise or a non-label abstains)."""
    def vote(x: Any) -> int:
        try:
            out = annotate(x)
        except Exception:  # noqa: BLE001 - a fault is an abstention, as in the sandbox
            return ABSTAIN
        if type(out) is not str:
            return ABSTAIN
        return label_index.get(out, ABSTAIN)
    return vote


def apply_bare_loop(annotators: list[Annotator], labels: list[str], rows: list[dict], workers: int) -> np.ndarray:
    index = {name: i for i, name in enumerate(labels)}
    votes = np.full((len(rows), len(annotators)), ABSTAIN, dtype=np.int32)
    for j, fn in enumerate(annotate_functions(annotators)):
        vote = vote_of(fn, index)
        votes[:, j] = [vote(x) for x in rows]
    return votes


def snorkel_lfs(annotators: list[Annotator], labels: list[str]) -> list:
    """Our annotators as Snorkel LFs: our label index is Snorkel's label, our ABSTAIN (-1) is Snorkel's."""
    from snorkel.labeling import LabelingFunction

    index = {name: i for i, name in enumerate(labels)}
    return [LabelingFunction(name=f"{a.name}-{a.id[:8]}", f=vote_of(fn, index))
            for a, fn in zip(annotators, annotate_functions(annotators), strict=True)]


def apply_snorkel_lf(annotators: list[Annotator], labels: list[str], rows: list[dict], workers: int) -> np.ndarray:
    from snorkel.labeling import LFApplier

    return LFApplier(snorkel_lfs(annotators, labels)).apply(rows, progress_bar=False).astype(np.int32)


def apply_sandbox(annotators: list[Annotator], labels: list[str], rows: list[dict], workers: int) -> np.ndarray:
    from engine.sandbox.executor import SandboxExecutor

    with SandboxExecutor(workers=workers) as executor:
        results = executor.run(annotators, rows, labels)
    return _stack(results)


def compiled_executor() -> type | None:
    """`CompiledExecutor` from the compiled annotator path (branch h-fast), wherever it lives; None when absent."""
    import importlib

    for module in ("engine.apply.executor", "engine.compiled", "engine.sandbox.compiled"):
        try:
            found = getattr(importlib.import_module(module), "CompiledExecutor", None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


def apply_compiled(annotators: list[Annotator], labels: list[str], rows: list[dict], workers: int) -> np.ndarray:
    executor_type = compiled_executor()
    if executor_type is None:
        raise Skipped("no CompiledExecutor in this checkout (branch h-fast not merged)")
    executor = executor_type(workers=workers)  # the sandbox it hands non-template code to
    try:
        if hasattr(executor, "split"):
            compiled, sandboxed = executor.split(annotators)
            COUNTS.update(compiled_annotators=len(compiled), sandboxed_annotators=len(sandboxed))
        results = executor.run(annotators, rows, labels)
    finally:
        getattr(executor, "close", lambda: None)()
    return _stack(results)


COUNTS: dict[str, int] = {}  # what the compiled path compiled and what it sent to its sandbox


def _stack(results: list) -> np.ndarray:
    faults = [r.first_error for r in results if r.faults]
    if faults:
        print(f"warning: {len(faults)} annotators faulted, e.g. {faults[0]}", file=sys.stderr)
    return np.stack([np.asarray(r.votes, dtype=np.int32) for r in results], axis=1)


class Skipped(RuntimeError):
    """An applier that cannot run here (its package or branch is absent): recorded, not a failure."""


# ---- measuring one applier (in a child process) ---------------------------------------------------------
def checksum(votes: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(votes, dtype=np.int32).tobytes()).hexdigest()[:16]


def peak_rss_mb() -> float:
    """This process's peak RSS plus the largest of its waited-for children's (`getrusage`, KiB on Linux).

    For this process `/proc/self/status`'s VmHWM is read where it exists: Linux keeps `ru_maxrss` across
    `execve`, so a child started by a big parent would otherwise report the parent's peak."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status = Path("/proc/self/status")
    if status.exists():
        own = next((int(line.split()[1]) for line in status.read_text().splitlines()
                    if line.startswith("VmHWM:")), own)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round((own + kids) / 1024, 1)


def measure(applier: str, rows: int, workers: int, pool_file: Path) -> dict[str, Any]:
    annotators, labels, base = load_pool(pool_file)
    data: Any = repeat_rows(base, rows)
    record: dict[str, Any] = {"applier": applier, "rows": rows, "annotators": len(annotators)}
    try:
        if applier == "snorkel-pandas":
            import pandas as pd
            from snorkel.labeling import PandasLFApplier

            frame = pd.DataFrame(data)
            lfs = snorkel_lfs(annotators, labels)
            started = time.perf_counter()
            votes = PandasLFApplier(lfs).apply(frame, progress_bar=False).astype(np.int32)
        else:
            fn = {"bare-loop": apply_bare_loop, "snorkel-lf": apply_snorkel_lf, "sandbox": apply_sandbox,
                  "compiled": apply_compiled}[applier]
            if applier.startswith("snorkel"):
                import snorkel.labeling  # noqa: F401 - imported (torch and all) outside the timing
            elif applier == "sandbox":
                import engine.sandbox.executor  # noqa: F401 - imports outside the timing, as Snorkel's
            elif applier == "compiled":
                compiled_executor()  # imports engine.apply.compiled (pyarrow and all) outside the timing
            started = time.perf_counter()
            votes = fn(annotators, labels, data, workers)
        seconds = time.perf_counter() - started
    except (Skipped, ImportError) as exc:
        return {**record, "skipped": str(exc) or type(exc).__name__}
    n_votes = votes.size
    return {**record, "seconds": round(seconds, 3), "votes_per_s": round(n_votes / seconds),
            "examples_per_s": round(rows / seconds), "checksum": checksum(votes),
            "fired": round(float((votes != ABSTAIN).mean()), 4), "peak_rss_mb": peak_rss_mb(), **COUNTS}


def run_child(applier: str, rows: int, workers: int, pool_file: Path) -> dict[str, Any]:
    """One applier in a child process; `load`: the 1-minute load average as it starts (other jobs and the
    previous applier included)."""
    load = round(os.getloadavg()[0], 1)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", applier, "--rows", str(rows),
           "--workers", str(workers), "--pool", str(pool_file)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"applier": applier, "rows": rows, "error": done.stderr.strip().splitlines()[-1:]}
    if done.stderr.strip():
        print(done.stderr.strip(), file=sys.stderr)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": load}


# ---- reporting ------------------------------------------------------------------------------------------
def run_meta(script: str) -> dict[str, str]:
    """What every bench result file opens with: when (UTC), the commit, the machine, the load average at the
    start and the command line (`script`: the bench file's name, e.g. "e2e_100k.py")."""
    return {"when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(), "machine": machine(),
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "command": f"python bench/{script} " + " ".join(sys.argv[1:])}


def measured(meta: dict[str, str]) -> str:
    """The sentence a bench result's table opens with: when, at which commit, on what machine under what load, by
    which command (`run_meta`'s fields)."""
    return (f"Measured {meta['when']} at commit {meta['commit']} on {meta['machine']}, load average {meta['load']} "
            f"at the start. Command: `{meta['command']}`.")


def save_result(out: Path, payload: dict, markdown_text: str) -> None:
    """Write a bench result as `out`.json (the payload: meta and the measured rows) and `out`.md (its table)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    out.with_suffix(".md").write_text(markdown_text)


def markdown(records: list[dict], meta: dict[str, Any]) -> str:
    lines = ["# Throughput: `bench/throughput.py` (issue 15)\n",
             f"Measured {meta['when']} at commit {meta['commit']} on {meta['machine']}, load average "
             f"{meta['load']} at the start and {meta.get('load_end', '?')} at the end (1, 5 and 15 min averages; they "
             f"count other jobs on the machine). Pool: {meta['annotators']} annotators "
             f"the offline agents evolved on "
             f"ChemProt ({meta['pool']}); rows: the workspace's {meta['base_rows']:,} ChemProt pool rows repeated. "
             f"Sandbox: "
             f"{meta['workers']} workers. Every applier in its own child process, one after another.\n",
             f"Command: `{meta['command']}`\n"]
    for rows in dict.fromkeys(r["rows"] for r in records):
        mine = [r for r in records if r["rows"] == rows]
        sums = {r["checksum"] for r in mine if "checksum" in r}
        lf = next((r for r in mine if r["applier"] == "snorkel-lf" and "votes_per_s" in r), None)
        pandas = next((r for r in mine if r["applier"] == "snorkel-pandas" and "votes_per_s" in r), None)
        lines += [f"## {rows:,} rows\n", "| applier | seconds | votes/s | examples/s | × LFApplier | "
                  "× PandasLFApplier | peak RSS MB | load | checksum |", "|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            if "votes_per_s" not in r:
                lines.append(f"| {r['applier']} | skipped: {r.get('skipped') or r.get('error')} | | | | | | | |")
                continue
            x_lf = f"{r['votes_per_s'] / lf['votes_per_s']:.2f}" if lf else "–"
            x_pd = f"{r['votes_per_s'] / pandas['votes_per_s']:.2f}" if pandas else "–"
            lines.append(f"| {r['applier']} | {r['seconds']:.2f} | {r['votes_per_s']:,} | {r['examples_per_s']:,} "
                         f"| {x_lf} | {x_pd} | {r['peak_rss_mb']:,} | {r.get('load', '–')} | `{r['checksum']}` |")
        lines.append("\nChecksums " + ("agree." if len(sums) == 1 else f"DISAGREE: {sorted(sums)}") + "\n")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--appliers", nargs="+", default=list(APPLIERS), choices=APPLIERS)
    parser.add_argument("--workers", type=int, default=2, help="sandbox worker processes")
    parser.add_argument("--skip-slow-above", type=int, default=100_000,
                        help="skip Snorkel's appliers above this many rows (0: never skip)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line and applier on stdout")
    parser.add_argument("--pool", type=Path, default=POOL_FILE)
    parser.add_argument("--fresh-pool", action="store_true", help="evolve the ChemProt pool again")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "throughput",
                        help="writes OUT.json and OUT.md ('-': write nothing)")
    parser.add_argument("--child", choices=APPLIERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows[0], args.workers, args.pool)))
        return
    if args.fresh_pool or not args.pool.exists():
        print("evolving the ChemProt pool ...", file=sys.stderr, flush=True)
        pool = evolve_pool()
        args.pool.parent.mkdir(parents=True, exist_ok=True)
        args.pool.write_text(json.dumps(pool, indent=1))
    ensure_rows()
    data = json.loads(args.pool.read_text())
    load_at_start, started = os.getloadavg(), datetime.now(UTC)
    records = []
    for rows in args.rows:
        for applier in args.appliers:
            if applier in SLOW and args.skip_slow_above and rows > args.skip_slow_above:
                record = {"applier": applier, "rows": rows, "annotators": len(data["annotators"]),
                          "skipped": f"--skip-slow-above {args.skip_slow_above}"}
            else:
                record = run_child(applier, rows, args.workers, args.pool)
            records.append(record)
            print(json.dumps(record) if args.json else f"{rows:>9,} {applier:<15} {record}", flush=True)
    meta = {"when": started.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(), "machine": machine(),
            "load": " ".join(f"{x:.1f}" for x in load_at_start),
            "load_end": " ".join(f"{x:.1f}" for x in os.getloadavg()), "annotators": len(data["annotators"]),
            "pool": f"{data['generations']} generations, seed {data['seed']}",
            "base_rows": len(json.loads(ROWS_FILE.read_text())),
            "workers": args.workers, "command": "python bench/throughput.py " + " ".join(sys.argv[1:])}
    if str(args.out) != "-":
        save_result(args.out, {"meta": meta, "records": records}, markdown(records, meta))


if __name__ == "__main__":
    main()
