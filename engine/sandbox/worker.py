"""Sandbox worker process: runs untrusted annotator code under OS limits, speaking JSON lines.

Started by `engine.sandbox.executor` as `python -S -m engine.sandbox.worker --memory-mb N`; never import it into the
engine process (it changes process-wide state). Protocol, one JSON object per line each way:
  {"op": "load", "offset": int, "labels": [str], "examples": [dict]}   -> {"ok": true, "n": int}
  {"op": "run", "source": str, "budget_s": float}                      -> {"ok": true, "votes": [int], ...}
"""
from __future__ import annotations

# Every allowed module is pre-imported so a guarded import needs no file access once limits are in place.
import argparse
import builtins
import collections
import collections.abc
import copy
import functools
import itertools
import json
import math
import os
import re
import resource
import signal
import socket
import string
import sys
import time
import unicodedata
from typing import Any

from engine.sandbox.checks import ALLOWED_IMPORTS, CodeRejected, check_source

ABSTAIN = -1
_SAFE_BUILTINS = [
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate",
    "filter", "float", "format", "frozenset", "hash", "hex", "int", "isinstance", "issubclass", "iter", "len",
    "list", "map", "max", "min", "next", "oct", "ord", "pow", "range", "repr", "reversed", "round", "set",
    "slice", "sorted", "str", "sum", "tuple", "type", "zip", "True", "False", "None", "NotImplemented",
    "Ellipsis",
]
_PRELOADED = (collections, functools, itertools, re, string, unicodedata)  # kept for guarded imports
_CODE_CACHE: dict[str, Any] = {}


class _Timeout(BaseException):
    """Raised by the CPU-time alarm; a BaseException so `except Exception` in user code does not eat it."""


class _Alarm:
    """Per-annotator CPU-time alarm; `expired` survives user code that swallows the exception."""

    armed = False
    expired = False

    @classmethod
    def fire(cls, signum: int, frame: object) -> None:
        cls.expired = True
        if cls.armed:
            raise _Timeout()

    @classmethod
    def start(cls, budget_s: float) -> None:
        cls.expired = False
        used = _cpu_seconds()
        # Kernel backstop for C-level loops (e.g. sum over a huge range) where Python signal handlers never run.
        _set_cpu_soft_limit(math.ceil(used + budget_s + 0.5))
        cls.armed = True
        signal.setitimer(signal.ITIMER_PROF, max(budget_s, 0.001), 0.05)

    @classmethod
    def stop(cls) -> None:
        cls.armed = False
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        _set_cpu_soft_limit(None)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _set_cpu_soft_limit(seconds: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = hard if seconds is None else seconds
    if hard != resource.RLIM_INFINITY and soft > hard:
        soft = hard
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def _guarded_import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0):
    parts = name.split(".")
    if level != 0 or parts[0] not in ALLOWED_IMPORTS or any(p.startswith("_") for p in parts):
        raise ImportError(f"import of {name!r} is not allowed in the sandbox")
    return builtins.__import__(name, globals_, locals_, fromlist, 0)


def _silent_print(*args: object, **kwargs: object) -> None:
    """stdout carries the protocol; annotator prints go nowhere."""


def _restricted_builtins() -> dict[str, Any]:
    table = {name: getattr(builtins, name) for name in _SAFE_BUILTINS}
    for name in dir(builtins):
        obj = getattr(builtins, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            table[name] = obj
    table["__import__"] = _guarded_import
    table["print"] = _silent_print
    return table


def _deny_network(*args: object, **kwargs: object) -> None:
    raise PermissionError("network access is disabled in the sandbox")


def _disable_network() -> None:
    for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo",
                 "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        setattr(socket, name, _deny_network)


def _apply_limits(memory_mb: int) -> None:
    """Best-effort OS limits; each one is skipped where the platform refuses it."""
    limits = [
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024),
        (resource.RLIMIT_FSIZE, 0),  # no file writes
        (resource.RLIMIT_CORE, 0),  # SIGXCPU must not leave core files behind
        (resource.RLIMIT_NOFILE, 16),
        (resource.RLIMIT_NPROC, 0),  # no fork (ignored for root)
    ]
    for res, value in limits:
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past FSIZE fails instead of killing us
    signal.signal(signal.SIGPROF, _Alarm.fire)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _compiled(source: str) -> Any:
    """Re-check (defence in depth) and compile, cached by source text."""
    code = _CODE_CACHE.get(source)
    if code is None:
        code = builtins.compile(check_source(source), "<annotator>", "exec")
        if len(_CODE_CACHE) > 512:
            _CODE_CACHE.clear()
        _CODE_CACHE[source] = code
    return code


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except _Timeout:
        raise
    except BaseException:  # noqa: BLE001 - user-defined __str__ may do anything
        text = type(exc).__name__
    return text[:300]


class _Batch:
    """The examples of one chunk, held once and shared by every annotator run on it."""

    def __init__(self, offset: int, labels: list[str], examples: list[dict]):
        self.offset = offset
        self.label_index = {name: i for i, name in enumerate(labels)}
        # Annotators get a fresh copy per call so one cannot change what the next one sees; the copy is as
        # shallow as each example allows (deepcopy costs ~50x a dict copy).
        self.examples = [(ex, _copy_depth(ex)) for ex in examples]


_SCALARS = (str, int, float, bool, type(None))


def _copy_depth(example: dict) -> int:
    """0: a dict copy suffices; 1: also copy containers of scalars (e.g. spans); 2: needs deepcopy."""
    depth = 0
    for value in example.values():
        if isinstance(value, _SCALARS):
            continue
        items = value.values() if type(value) is dict else value if type(value) in (list, set) else None
        if items is None or not all(isinstance(v, _SCALARS) for v in items):
            return 2
        depth = 1
    return depth


def _fresh(example: dict, depth: int) -> dict:
    if depth == 0:
        return dict(example)
    if depth == 1:
        return {k: (v if isinstance(v, _SCALARS) else v.copy()) for k, v in example.items()}
    return copy.deepcopy(example)


def run_annotator(source: str, batch: _Batch, budget_s: float) -> dict[str, Any]:
    """Votes of one annotator on the loaded chunk. `stopped` means the rest of its run is void."""
    n = len(batch.examples)
    votes = [ABSTAIN] * n
    faulted = bytearray(n)
    first_error: str | None = None
    started = time.perf_counter()
    try:
        code = _compiled(source)
    except CodeRejected as exc:
        return _reply(votes, n, f"rejected: {exc.reason}", True, 0.0)
    label_index = batch.label_index
    done = 0  # examples before `done` are finished; a timeout voids the rest
    try:
        _Alarm.start(budget_s)
        try:
            namespace: dict[str, Any] = {"__builtins__": _restricted_builtins(), "__name__": "annotator"}
            exec(code, namespace)  # noqa: S102 - the one place annotator code runs, under limits
            annotate = namespace["annotate"]
        except _Timeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - user code may raise SystemExit and the like
            return _reply(votes, n, f"{_describe(exc)} at module level", True, time.perf_counter() - started)
        for i, (example, depth) in enumerate(batch.examples):
            done = i
            if _Alarm.expired:
                raise _Timeout()
            try:
                out = annotate(dict(example) if depth == 0 else _fresh(example, depth))
            except _Timeout:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure of user code is a fault
                faulted[i] = 1
                first_error = first_error or f"{_describe(exc)} on example {batch.offset + i}"
                continue
            if out is None:
                continue
            index = label_index.get(out) if type(out) is str else None
            if index is None:
                faulted[i] = 1
                first_error = first_error or f"returned {repr(out)[:60]}, not a label (example {batch.offset + i})"
            else:
                votes[i] = index
        done = n
    except _Timeout:
        votes[done:] = [ABSTAIN] * (n - done)
        faulted[done:] = b"\x01" * (n - done)
        first_error = first_error or f"timeout after {budget_s:.1f}s"
    finally:
        _Alarm.stop()
    return _reply(votes, sum(faulted), first_error, done < n, time.perf_counter() - started)


def _reply(votes: list[int], faults: int, first_error: str | None, stopped: bool, seconds: float) -> dict:
    return {"ok": True, "votes": votes, "faults": faults, "first_error": first_error, "stopped": stopped,
            "seconds": seconds}


def serve(memory_mb: int) -> None:
    """Answer requests until stdin closes. Stdout is reserved for replies; fd 1 goes to /dev/null."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    stdin = sys.stdin.buffer
    _disable_network()
    _apply_limits(memory_mb)
    batch = _Batch(0, [], [])
    for line in stdin:
        try:
            msg = json.loads(line)
            if msg["op"] == "load":
                batch = None  # free the previous chunk before parsing grows the next one
                batch = _Batch(int(msg["offset"]), list(msg["labels"]), list(msg["examples"]))
                reply: dict[str, Any] = {"ok": True, "n": len(batch.examples)}
            elif msg["op"] == "run":
                reply = run_annotator(str(msg["source"]), batch, float(msg["budget_s"]))
            else:
                reply = {"ok": False, "error": f"unknown op {msg['op']!r}"}
        except _Timeout:
            reply = {"ok": False, "error": "timeout outside annotator"}
        except BaseException as exc:  # noqa: BLE001 - a worker bug must answer, not kill the loop
            reply = {"ok": False, "error": _describe(exc)}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-mb", type=int, default=512)
    serve(parser.parse_args().memory_mb)


if __name__ == "__main__":
    main()
