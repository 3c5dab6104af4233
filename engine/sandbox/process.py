"""The parent's handle on one sandbox worker process: spawn it, ask it one JSON line, kill it, say how it died.

Kept apart from `engine.sandbox.executor` (which schedules work over a pool of these) so each reads in one sitting.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.sandbox.cgroup import WorkerCgroup
from engine.sandbox.wire import AWAITING_NONCE, AWAITING_SOURCE, FrameError, FrameReader, has_nonce, new_nonce

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 30.0
TREE_PIDS_MAX = 32  # worker, init, holder, one run child and their threads; seccomp refuses a run's forks first
CONTROL_REPLY_CAP = 1 << 20  # the hello and load replies are a few hundred bytes


class WorkerFailed(RuntimeError):
    """The worker died, hung past its deadline or answered nonsense; it has been killed.

    `timed_out` marks the two ways a runaway annotator ends: the kernel's CPU limit or the parent's deadline.
    """

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class WorkerProcess:
    """One worker process (and its init and holder), the chunk it currently holds, and the containment it reported."""

    def __init__(self, memory_mb: int, unchecked: bool = False, tree_memory_mb: int | None = None):
        """`tree_memory_mb`: the cgroup's cap on the memory of the whole tree (default `memory_mb`, which also
        caps each process's address space)."""
        self.cgroup, cgroup_off = WorkerCgroup.create((tree_memory_mb or memory_mb) << 20, TREE_PIDS_MAX)
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1"}
        # stderr goes to a temp file so a worker that dies while starting can say why; once the worker's
        # limits are on (RLIMIT_FSIZE = 0) nothing more can be written there.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker; see close()
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-S", "-m", "engine.sandbox.worker", "--reply-fd", str(write_fd),
                "--memory-mb", str(memory_mb)] + (["--unchecked"] if unchecked else [])
        for procs in self.cgroup.procs_files if self.cgroup else []:
            argv += ["--cgroup-procs", procs]
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr, cwd=_PROJECT_ROOT,
                env=env, close_fds=True, pass_fds=(write_fd,), start_new_session=True,
            )
        except BaseException:
            self._drop_cgroup()
            raise
        finally:
            os.close(write_fd)
        self._reply_fd = read_fd
        self.worker_reply_fd = write_fd  # its number in the worker (the containment tests forge frames into it)
        self._frames = FrameReader(read_fd)
        self.chunk_key: tuple[int, int] | None = None
        self._holds_rows = False  # its holder has parsed a load: the next load goes to a fresh one
        self.containment: dict[str, str] = dict(self._read(STARTUP_TIMEOUT_S, CONTROL_REPLY_CAP)["containment"])
        joined = self.containment.get("cgroup", "")
        self.containment["cgroup"] = (self.cgroup.describe() if self.cgroup and joined.startswith("on")
                                      else cgroup_off or joined)

    def request(self, payload: bytes, timeout_s: float, cap: int = CONTROL_REPLY_CAP) -> dict[str, Any]:
        """Send one JSON line and wait for the framed answer; on any failure kill the worker and raise."""
        self._send(payload)
        reply = self._read(timeout_s, cap)
        return self._ok(reply)

    def load(self, payload: bytes, timeout_s: float) -> dict[str, Any]:
        """A load request, to a holder that never held other rows (engine.sandbox.worker)."""
        if self._holds_rows:
            self.request(b'{"op":"fresh"}\n', timeout_s)
        self._holds_rows = True
        return self.request(payload, timeout_s)

    def run(self, source: str, budget_s: float, wall_s: float, timeout_s: float, cap: int) -> dict[str, Any]:
        """A run: the header, then (the run's child forked) its source, which only that child reads, then a fresh
        nonce, and only a reply that carries it is taken; anything else kills the worker (engine.sandbox.wire)."""
        deadline = time.monotonic() + timeout_s
        data = source.encode("utf-8", "replace")  # a lone surrogate: a "?" for the child's checker, not a crash here
        header = {"op": "run", "source_bytes": len(data), "budget_s": budget_s, "wall_s": wall_s}
        for payload, expected in ((f"{json.dumps(header)}\n".encode(), AWAITING_SOURCE), (data, AWAITING_NONCE)):
            self._send(payload)
            ack = self._read(max(0.05, deadline - time.monotonic()), CONTROL_REPLY_CAP)
            if ack != expected:
                self._ok(ack)
                self.kill()
                raise WorkerFailed("a frame out of turn before the run's acknowledgement (forged or stale), "
                                   "worker killed")
        nonce = new_nonce()
        self._send(f"{nonce}\n".encode())
        reply = self._read(max(0.05, deadline - time.monotonic()), cap)
        if reply.get("ok") and not has_nonce(reply, nonce):
            self.kill()
            raise WorkerFailed("a reply frame without this run's nonce (forged or stale), worker killed")
        return self._ok(reply)

    def _send(self, payload: bytes) -> None:
        try:
            self.proc.stdin.write(payload)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:
            raise self._died(f"{type(exc).__name__} on the pipe") from None

    def _ok(self, reply: dict[str, Any]) -> dict[str, Any]:
        if not reply.get("ok"):
            self.kill()  # its state is unknown now; a fresh worker is cheap
            raise WorkerFailed(f"worker error: {reply.get('error')!r}")
        return reply

    def _read(self, timeout_s: float, cap: int) -> dict[str, Any]:
        try:
            return self._frames.read(timeout_s, cap)
        except FrameError as exc:
            if exc.timed_out:
                self.kill()
                raise WorkerFailed(f"no answer within {timeout_s:.1f}s wall clock, worker killed", True) from None
            raise self._died(str(exc)) from None
        except OSError as exc:
            raise self._died(f"{type(exc).__name__} on the reply pipe") from None

    def _died(self, what: str) -> WorkerFailed:
        """Kill (if needed) and describe how the worker ended."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        self._stderr.seek(0)
        last = [line for line in self._stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        what = f"{what}: {last[-1].strip()[:200]}" if last else what
        if code is not None and code < 0:
            return WorkerFailed(f"worker killed by {signal.Signals(-code).name} ({what})")
        return WorkerFailed(f"worker exited with code {code} ({what})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        stop_process(self.proc, grace_s=0.0)
        if self.cgroup:
            self.cgroup.kill_all()
        self.chunk_key = None

    def close(self) -> None:
        stop_process(self.proc)
        self._drop_cgroup()
        self._stderr.close()
        try:
            os.close(self._reply_fd)
        except OSError:
            pass

    def _drop_cgroup(self) -> None:
        """Kill whatever is left in the worker's cgroup and remove it."""
        if self.cgroup:
            self.cgroup.remove()
            self.cgroup = None


def stop_process(proc: subprocess.Popen, grace_s: float = 1.0) -> None:
    """Close its stdin (a worker exits at end of input), wait up to `grace_s`, then SIGKILL; reap it."""
    if proc.poll() is None:
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        if grace_s > 0:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    if proc.poll() is None:  # the whole group while its leader lives (so the id is still ours): worker,
        try:  # init, holder and a run's child; none of them may leave the group (seccomp refuses setsid/setpgid)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdin, proc.stdout):
        if stream is None:
            continue
        try:
            stream.close()
        except OSError:
            pass


def shutdown(workers: list[WorkerProcess | None]) -> None:
    """Stop every worker of a pool in place (also run by the executor's finalizer)."""
    for slot, worker in enumerate(workers):
        if worker is not None:
            worker.close()
            workers[slot] = None
