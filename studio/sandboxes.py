"""The studio's warm sandboxes for quick runs (a preview, a save, a few labeled rows), leased one per run.

One sandbox shared by the whole server ran one expert's run at a time: a second expert's preview waited behind the
first's slow one. Each lease takes an idle sandbox, starts one while there are fewer than the limit, else waits for
one to come back. Evolution jobs do not lease: they start their own.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from engine.sandbox.executor import SandboxExecutor

QUICK_SANDBOXES = 3  # quick runs at once on one server (a sandbox holds one worker process while idle)


class SandboxLeases:
    """At most `size` sandboxes made by `make`, lent to one run at a time and kept warm between runs."""

    def __init__(self, size: int = QUICK_SANDBOXES,
                 make: Callable[[], SandboxExecutor] = lambda: SandboxExecutor(workers=1, time_budget_s=2.0)):
        if size < 1:
            raise ValueError(f"a server needs at least one sandbox, not {size}")
        self.size = size
        self._make = make
        self._idle: list[SandboxExecutor] = []
        self._made = 0
        self._changed = threading.Condition()

    @contextmanager
    def lease(self) -> Iterator[SandboxExecutor]:
        """A sandbox of one's own for the block: an idle one, a new one under the limit, or the next one returned."""
        with self._changed:
            while not self._idle and self._made >= self.size:
                self._changed.wait()
            sandbox = self._idle.pop() if self._idle else None
            if sandbox is None:
                self._made += 1  # counted before it starts, so two leases at once do not both pass the limit
        if sandbox is None:
            try:
                sandbox = self._make()
            except BaseException:
                with self._changed:
                    self._made -= 1
                    self._changed.notify()
                raise
        try:
            yield sandbox
        finally:
            with self._changed:
                self._idle.append(sandbox)
                self._changed.notify()

    @property
    def started(self) -> int:
        """How many sandboxes exist now (idle or lent)."""
        with self._changed:
            return self._made

    def close(self) -> None:
        """Stop the idle sandboxes' workers (a lent one keeps running its run; it is stopped when garbage)."""
        with self._changed:
            idle, self._idle = self._idle, []
            self._made -= len(idle)
        for sandbox in idle:
            sandbox.close()
