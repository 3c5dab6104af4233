"""The parent's handle on one sandbox worker process: spawn it, ask it one JSON line, kill it, say how it died.

Kept apart from `engine.sandbox.executor` (which schedules work over a pool of these) so each reads in one sitting.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class WorkerFailed(RuntimeError):
    """The worker died, hung past its deadline or answered nonsense; it has been killed.

    `timed_out` marks the two ways a runaway annotator ends: the kernel's CPU limit or the parent's deadline.
    """

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class WorkerProcess:
    """One worker process and the chunk it currently holds."""

    def __init__(self, memory_mb: int):
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1"}
        # stderr goes to a temp file so a worker that dies while starting can say why; once the worker's
        # limits are on (RLIMIT_FSIZE = 0) nothing more can be written there.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker; see close()
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "engine.sandbox.worker", "--memory-mb", str(memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=_PROJECT_ROOT,
            env=env, close_fds=True, start_new_session=True,
        )
        self._fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._poll = select.poll()  # not select(): a busy server may hand out fds above FD_SETSIZE
        self._poll.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self._buf = bytearray()
        self.chunk_key: tuple[int, int] | None = None

    def request(self, payload: bytes, timeout_s: float) -> dict[str, Any]:
        """Send one JSON line and wait for the answer; on any failure kill the worker and raise."""
        try:
            self.proc.stdin.write(payload)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            reply = json.loads(self._read_line(timeout_s))
        except (OSError, ValueError) as exc:
            raise self._died(f"{type(exc).__name__} on the pipe") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            self.kill()  # its state is unknown now; a fresh worker is cheap
            raise WorkerFailed(f"worker error: {reply.get('error') if isinstance(reply, dict) else reply!r}")
        return reply

    def _read_line(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while (end := self._buf.find(b"\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailed(f"no answer within {timeout_s:.1f}s wall clock, worker killed", True)
            if self._poll.poll(max(1, int(left * 1000))):
                data = os.read(self._fd, 1 << 16)
                if not data:
                    raise self._died("end of output")
                self._buf += data
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return line

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
        if code is not None and code < 0 and signal.Signals(-code) == signal.SIGXCPU:
            return WorkerFailed("worker stopped at its CPU limit", timed_out=True)
        if code is not None and code < 0:
            return WorkerFailed(f"worker killed by {signal.Signals(-code).name} ({what})")
        return WorkerFailed(f"worker exited with code {code} ({what})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        stop_process(self.proc, grace_s=0.0)
        self.chunk_key = None

    def close(self) -> None:
        stop_process(self.proc)
        self._stderr.close()


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
        if proc.poll() is None:
            proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()  # type: ignore[union-attr]
        except OSError:
            pass


def shutdown(workers: list[WorkerProcess | None]) -> None:
    """Stop every worker of a pool in place (also run by the executor's finalizer)."""
    for slot, worker in enumerate(workers):
        if worker is not None:
            worker.close()
            workers[slot] = None
