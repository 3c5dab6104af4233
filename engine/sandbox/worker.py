"""Sandbox worker process: confines itself, then runs untrusted annotator code, one fresh child per run.

Started by `engine.sandbox.process` as `python -S -m engine.sandbox.worker --reply-fd N --memory-mb M`; never
import it into the engine process (it changes process-wide state). Before reading anything it confines itself
(engine.sandbox.confine: nobody, namespaces, empty root, no capabilities, Landlock, seccomp), then forks the
init, pid 1 of its own pid namespace, which reads no request: it forks a holder per chunk, and the holder reads
the chunk and forks a pristine child per annotator run, so no annotator ever runs where another could have
changed its state, and none inherits memory that held another chunk's rows or another annotator's source (the
run's child reads its own source from stdin; the holder never does). The child adds the RUN seccomp filter (no
processes, no signals), runs the annotator and sends its reply to the holder, which checks it and forwards it.
Requests arrive as JSON lines on stdin, in lockstep (the parent waits for each answer before it sends more, so
no process reads ahead into bytes meant for another); replies leave as frames (engine.sandbox.wire) on the reply
fd, never on stdout (which is /dev/null):
  first frame                                                             {"ok": true, "containment": {...}}
  {"op": "load", "offset": int, "labels": [str], "examples": [dict]}   -> {"ok": true, "n": int}
  {"op": "fresh"}  (before every load but a holder's first)               -> {"ok": true}, then a new holder
  {"op": "run", "source_bytes": int, "budget_s": float, "wall_s": float} -> {"ok": true, "awaiting": "source"}
  then the source, that many bytes of UTF-8, read by the run's child       -> {"ok": true, "awaiting": "nonce"}
  then one line: a fresh hex nonce                                        -> {"ok": true, "votes": packed, ...,
                                                                             "nonce": the same}
(votes packed as engine.sandbox.wire.pack_votes writes them: base64 of one small int per example)
"""
from __future__ import annotations

# Every allowed module is pre-imported so a guarded import needs no file access once confined.
import argparse
import builtins
import collections
import collections.abc
import functools
import gc
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

from engine.sandbox import confine, seccomp
from engine.sandbox.alarm import Alarm, Timeout
from engine.sandbox.checks import ALLOWED_IMPORTS, CodeRejected, LabelIndex, check_source
from engine.sandbox.wire import (
    AWAITING_NONCE,
    AWAITING_SOURCE,
    NONCE_HEX_CHARS,
    FrameError,
    FrameReader,
    encode,
    pack_votes,
    unpack_votes,
    write_all,
)

ABSTAIN = -1
_SAFE_BUILTINS = [
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate",
    "filter", "float", "format", "frozenset", "hash", "hex", "int", "isinstance", "issubclass", "iter", "len",
    "list", "map", "max", "min", "next", "oct", "ord", "pow", "range", "repr", "reversed", "round", "set",
    "slice", "sorted", "str", "sum", "tuple", "type", "zip", "object", "True", "False", "None", "NotImplemented",
    "Ellipsis",
]
_PRELOADED = (collections, functools, itertools, re, string, unicodedata)  # kept for guarded imports
MAX_SOURCE_BYTES = 1 << 20
_FRESH_EXIT = 75  # a holder's exit status asking the init for a fresh one
_OUT_OF_STEP_EXIT = 76  # a holder that lost its place in the request stream: the worker ends
_READY = {"ready": True}  # a run's child has its source and no longer holds stdin (sent before annotator code runs)
_UNCHECKED = False  # set once by main(); see --unchecked
_RUN_FILTER = seccomp.run_filter()  # built once; each run's child only loads it
_SECCOMP_ON = False  # set by main() when the worker's BASE filter loaded: a child that cannot add RUN then exits
_UNREAPED: list[int] = []  # killed children of answered runs, reaped once the reply is out


def _guarded_import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0):
    parts = name.split(".")
    if level != 0 or parts[0] not in ALLOWED_IMPORTS or any(p.startswith("_") for p in parts):
        raise ImportError(f"import of {name!r} is not allowed in the sandbox")
    return builtins.__import__(name, globals_, locals_, fromlist, 0)


def _silent_print(*args: object, **kwargs: object) -> None:
    """Annotator prints go nowhere (stdout is /dev/null anyway; replies have their own pipe)."""


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


def _compiled(source: str) -> Any:
    """Re-check (defence in depth) and compile; `_UNCHECKED` (containment tests only) skips the check."""
    return builtins.compile(source if _UNCHECKED else check_source(source), "<annotator>", "exec")


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Timeout:
        raise
    except BaseException:  # noqa: BLE001 - user-defined __str__ may do anything
        text = type(exc).__name__
    return text[:300]


class _Batch:
    """The examples of one chunk, held by its holder; each run's child sees them as they were loaded."""

    def __init__(self, offset: int, labels: list[str], examples: list[dict]):
        self.offset = offset
        self.labels = labels
        self.label_index = LabelIndex(labels)  # a label, or one written in another case (`'spam'` for SPAM)
        self.examples = examples


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
    except BaseException as exc:  # noqa: BLE001 - e.g. a SyntaxError the check did not see
        return _reply(votes, n, f"does not compile: {_describe(exc)}", True, 0.0)
    label_index = batch.label_index
    done = 0  # examples before `done` are finished; a timeout voids the rest
    try:
        Alarm.start(budget_s)
        try:
            table = builtins.__dict__ if _UNCHECKED else _restricted_builtins()
            namespace: dict[str, Any] = {"__builtins__": table, "__name__": "annotator"}
            exec(code, namespace)  # noqa: S102 - the one place annotator code runs, under limits
            annotate = namespace["annotate"]
        except Timeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - user code may raise SystemExit and the like
            return _reply(votes, n, f"{_describe(exc)} at module level", True, time.perf_counter() - started)
        for i, example in enumerate(batch.examples):
            done = i
            if Alarm.expired:
                raise Timeout()
            try:
                out = annotate(example)  # a mutation reaches later rows of this run only: the child dies after
            except Timeout:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure of user code is a fault
                faulted[i] = 1
                first_error = first_error or f"{_describe(exc)} on example {batch.offset + i}"
                continue
            if out is None:
                continue
            index = label_index.of(out)
            if index is None:
                faulted[i] = 1
                first_error = first_error or f"returned {repr(out)[:60]}, not a label (example {batch.offset + i})"
            else:
                votes[i] = index
        done = n
    except Timeout:
        votes[done:] = [ABSTAIN] * (n - done)
        faulted[done:] = b"\x01" * (n - done)
        first_error = first_error or f"timeout after {budget_s:.1f}s"
    finally:
        Alarm.stop()
    return _reply(votes, sum(faulted), first_error, done < n, time.perf_counter() - started)


def _reply(votes: list[int], faults: int, first_error: str | None, stopped: bool, seconds: float) -> dict:
    return {"ok": True, "votes": votes, "faults": faults, "first_error": first_error, "stopped": stopped,
            "seconds": seconds}


def _read_source(size: int) -> str:
    """The run's source, exactly `size` bytes from stdin (unbuffered: nothing past it is taken)."""
    data = bytearray()
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise EOFError("stdin closed inside a source")
        data += chunk
    return data.decode("utf-8")


def _run_in_child(source_bytes: int, batch: _Batch, budget_s: float, reply_fd: int) -> None:
    """In the forked child: read this run's source, keep only the result pipe, say it is ready, add the RUN
    filter, run, send the reply, exit."""
    try:
        gc.disable()  # short-lived: a collection would touch (and so copy) the holder's pages for nothing
        # stdout and stderr: a pipe nobody reads (a write fails: EPIPE), not the host's /dev/null the holder holds,
        # whose inode an open fd could still touch (utimes) or lock (flock) for as long as the worker lives
        sink, end = os.pipe()
        os.dup2(end, 1)
        os.dup2(end, 2)
        os.close(sink)
        os.close(end)
        os.closerange(3, reply_fd)  # every fd, however high: the worker's own reply fd is the parent's number
        os.closerange(reply_fd + 1, 1 << 20)
        hard = math.ceil(budget_s) + 2  # SIGKILL there; the alarm's soft limit (SIGXCPU) comes first
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))  # a hard limit the annotator cannot raise
        # no new process or thread (the worker's others already run as its uid): without seccomp's RUN filter
        # (any machine but x86_64) a forked helper of the run could otherwise outlive it and kill later runs
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        source = _read_source(source_bytes)
        os.close(0)  # before the holder asks for the nonce, which travels on stdin too
        write_all(reply_fd, encode(_READY))
        if not _RUN_FILTER.load().startswith("on") and _SECCOMP_ON:
            return  # the layer the report says is on would be missing for this run: no run (a fault), not a weak one
        write_all(reply_fd, encode(_packed(run_annotator(source, batch, budget_s), batch)))
    finally:
        os._exit(0)


def _packed(reply: dict, batch: _Batch) -> dict:
    """The reply with its votes packed for the wire (engine.sandbox.wire.pack_votes), if they are a list."""
    if isinstance(reply.get("votes"), list):
        return {**reply, "votes": pack_votes(reply["votes"], len(batch.labels))}
    return reply


def _checked(reply: dict, batch: _Batch) -> dict:
    """The child's reply as the holder forwards it: well-formed, votes in range, or a fault. Its seconds go on as
    the child gave them: the executor bounds them by the time it saw the run take (`_honest_seconds`)."""
    n, k = len(batch.examples), len(batch.labels)
    try:
        votes = unpack_votes(reply.get("votes"), k)
    except (ValueError, UnicodeError) as exc:
        raise FrameError("malformed votes") from exc
    if len(votes) != n or (n and (min(votes) < ABSTAIN or max(votes) >= k)):
        raise FrameError("malformed votes")
    faults = reply.get("faults")
    error = reply.get("first_error")
    seconds = reply.get("seconds")  # the executor bounds it by the time it saw; here only a float or nothing
    if type(seconds) is int:
        seconds = float(seconds) if abs(seconds) < 1 << 53 else 0.0  # 4,000 digits of JSON overflow a float
    if type(seconds) is not float or not math.isfinite(seconds):
        seconds = 0.0
    return _reply(reply["votes"], faults if type(faults) is int and 0 <= faults <= n else n,
                  error[:300] if isinstance(error, str) else None, reply.get("stopped") is True, seconds)


def _await_nonce(reply_fd: int) -> str:
    """Acknowledge the run and read its nonce, which the parent sends only now: the child was forked without
    it, so a frame the child might smuggle onto the reply pipe cannot carry it (engine.sandbox.wire)."""
    write_all(reply_fd, encode(AWAITING_NONCE))
    nonce = sys.stdin.buffer.readline().decode("ascii", "replace").strip()
    if not (len(nonce) == NONCE_HEX_CHARS and all(c in "0123456789abcdef" for c in nonce)):
        raise ValueError("the run's nonce line is malformed")
    return nonce


def run_isolated(source_bytes: int, batch: _Batch, budget_s: float, wall_s: float, reply_fd: int) -> dict[str, Any]:
    """One annotator over the chunk in a fresh fork that reads its own source; the reply carries the run's nonce,
    asked for once the child holds its source and no longer holds stdin. The annotator's death, hang or nonsense
    is a fault, not a worker crash."""
    if not 0 <= source_bytes <= MAX_SOURCE_BYTES:
        raise ValueError(f"a source of {source_bytes} bytes")
    n = len(batch.examples)
    started = time.perf_counter()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_in_child(source_bytes, batch, budget_s, write_fd)
    os.close(write_fd)
    why, timed_out, reply = None, False, None
    try:
        frames = FrameReader(read_fd)
        write_all(reply_fd, encode(AWAITING_SOURCE))
        try:
            ready: dict[str, Any] | str = frames.read(wall_s, 64)
        except FrameError as exc:
            ready = str(exc)
        if ready != _READY:  # our own code failed before the annotator's: stdin may hold the rest of the source
            raise RuntimeError(f"the run's child did not take its source ({ready})")
        nonce = _await_nonce(reply_fd)
        try:
            reply = _checked(frames.read(max(0.0, started + wall_s - time.perf_counter()), 4096 + 16 * n), batch)
        except FrameError as exc:
            timed_out = exc.timed_out
            why = f"no answer within {wall_s:.1f}s wall clock, run killed" if timed_out else str(exc)
            if why == "end of stream" and _still_running(pid):
                why = "it closed its result pipe without answering"
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise  # the stream is out of step: `serve` answers, then ends the worker (the parent may still be writing)
    finally:
        os.close(read_fd)
    try:
        os.kill(pid, signal.SIGKILL)  # whatever it is doing now, its run is over
    except ProcessLookupError:
        pass
    if reply is not None:
        _UNREAPED.append(pid)  # reaped after the reply is sent: its exit overlaps the parent's next request
        return {**reply, "nonce": nonce}
    _, status, usage = os.wait4(pid, 0)
    if usage.ru_utime + usage.ru_stime >= budget_s and not timed_out:
        why, timed_out = "stopped at its CPU limit", True
    elif os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
        why = f"annotator process killed by {signal.Signals(os.WTERMSIG(status)).name}"
    elif os.WIFSIGNALED(status) and not timed_out and why == "end of stream":
        why = "killed before it answered (over the worker's memory cap, most likely)"
    text = f"timeout after {budget_s:.1f}s: {why}" if timed_out else f"annotator process failed: {why}"
    return {**_reply([ABSTAIN] * n, n, text, True, time.perf_counter() - started), "nonce": nonce}


def _still_running(pid: int, wait_s: float = 0.2) -> bool:
    """Whether the run's child lives on after its result pipe closed: a child killed for memory closes the pipe as
    it dies, so it is gone (a zombie) within moments; one that closed the pipe itself is not."""
    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return False
        time.sleep(0.005)
    return True


def serve(reply_fd: int) -> int:
    """The holder: answer JSON-line requests from stdin with frames on `reply_fd` until stdin closes (0) or a
    "fresh" request (_FRESH_EXIT: the init forks a new holder, which never held this one's rows)."""
    batch = _Batch(0, [], [])
    for line in sys.stdin.buffer:
        fresh = out_of_step = False
        try:
            msg = json.loads(line)
            if msg["op"] == "load":
                batch = None  # type: ignore[assignment]  # free the previous chunk before parsing grows the next one
                batch = _Batch(int(msg["offset"]), [str(x) for x in msg["labels"]], list(msg["examples"]))
                gc.collect()
                gc.freeze()  # the chunk leaves the collector's view: a child's collections do not copy its pages
                reply: dict[str, Any] = {"ok": True, "n": len(batch.examples)}
            elif msg["op"] == "run":
                out_of_step = True  # until the run returns: stdin may hold the rest of a source nobody read
                reply = None  # type: ignore[assignment]  # the previous run's reply (its votes) must not be in the next run's frame
                reply = run_isolated(int(msg["source_bytes"]), batch, float(msg["budget_s"]),
                                     float(msg["wall_s"]), reply_fd)
                out_of_step = False
            elif msg["op"] == "fresh":
                reply, fresh = {"ok": True}, True
            else:
                reply = {"ok": False, "error": f"unknown op {msg['op']!r}"}
        except BaseException as exc:  # noqa: BLE001 - a worker bug must answer, not kill the loop
            reply = {"ok": False, "error": _describe(exc)}
        write_all(reply_fd, encode(_packed(reply, batch)))
        while _UNREAPED:
            os.waitpid(_UNREAPED.pop(), 0)
        if fresh:
            return _FRESH_EXIT
        if out_of_step:
            # reading on would take the rest of the source for requests, each answered while the parent, still
            # writing it, reads nothing: both would block for good. Ending the worker closes stdin, so the parent's
            # write fails at once and it replaces the worker
            return _OUT_OF_STEP_EXIT
    return 0


def _init(reply_fd: int, report: dict[str, str]) -> None:
    """pid 1: say hello, then fork a holder per chunk and reap; it reads no request, so it holds no rows or
    sources for a holder to inherit."""
    write_all(reply_fd, encode({"ok": True, "containment": report}))
    gc.collect()
    gc.freeze()  # what is alive now leaves the collector's view: a holder's collections do not copy its pages
    while True:
        holder = os.fork()
        if holder == 0:
            confine.die_with_parent()
            os._exit(serve(reply_fd))
        while True:
            pid, status = os.wait()  # the holder, or a run's child it left behind
            if pid == holder:
                break
        code = os.waitstatus_to_exitcode(status)
        if code != _FRESH_EXIT:
            os._exit(code if code >= 0 else 128 - code)


def _wait_for_init(pid: int, reply_fd: int) -> None:
    """The outer process only waits: the init's holder alone talks to the parent, so EOF follows its death."""
    os.close(0)
    os.close(reply_fd)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    global _UNCHECKED, _SECCOMP_ON
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--cgroup-procs", action="append", default=[],
                        help="a cgroup.procs file to join before confining (the parent made the cgroup)")
    parser.add_argument("--unchecked", action="store_true",
                        help="containment tests only: no code check, full builtins (the OS layers alone hold)")
    args = parser.parse_args()
    _UNCHECKED = args.unchecked
    _disable_network()
    report = confine.confine(args.memory_mb, args.cgroup_procs)
    _SECCOMP_ON = report["seccomp"].startswith("on")
    signal.signal(signal.SIGPROF, Alarm.fire)
    pid = os.fork()
    if pid:
        _wait_for_init(pid, args.reply_fd)
    confine.die_with_parent()
    report["pid namespace"] = ("on: the worker's init is pid 1; every process of the worker dies with it"
                               if os.getpid() == 1 else "off: no pid namespace")
    report["integrity"] = ("on: every chunk a fresh holder forked from an init that reads no request, every "
                           "annotator run a fresh fork of it that reads its own source; neither runs annotator code"
                           if _SECCOMP_ON else
                           "partial: every chunk a fresh holder and every run a fresh fork, but without seccomp's RUN "
                           "filter a run can signal its own holder and so fault the runs after it on its chunk")
    report["wire"] = (f"on: length-prefixed, capped frames on fd {args.reply_fd} (stdout is /dev/null), a per-run "
                      "nonce the run's child never sees, votes range-checked")
    report["checker"] = "off: --unchecked (containment tests)" if _UNCHECKED else "on: re-checked in the worker"
    _init(args.reply_fd, report)


if __name__ == "__main__":
    main()
