"""Who is acting: the person whose verdicts, edits, labels and descriptions are being recorded.

Several experts work on one workspace at once (each in a studio session, or at the command line). The name is set
once for the thread that acts for them (a CLI command), or found through the studio's resolver (the session whose
script runs), and the store reads it where it records a person's action, so no function between the screen and the
store needs to pass it along. A background job's thread has none: what it records is the gate's.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_expert: ContextVar[str] = ContextVar("expert", default="")
_resolver: list[Callable[[], str]] = []  # the studio's: the name of the session whose script is running
UNNAMED = "expert (no name given)"


def set_acting_expert(name: str) -> None:
    """The person this thread acts for, from now on (a CLI command, a bench's simulated expert)."""
    _expert.set(name.strip())


@contextmanager
def acting_as(name: str) -> Iterator[None]:
    """The person this thread acts for within the block (then whoever it was before)."""
    token = _expert.set(name.strip())
    try:
        yield
    finally:
        _expert.reset(token)


def resolve_expert_with(resolver: Callable[[], str]) -> None:
    """Where a thread that set no name finds one: the studio asks the session whose script (or fragment) runs."""
    _resolver[:] = [resolver]


def acting_expert() -> str:
    """The name recorded with a person's action in this thread."""
    name = _expert.get()
    if not name and _resolver:
        try:
            name = _resolver[0]().strip()
        except Exception:  # noqa: BLE001 - outside a session (a job's thread): nobody to name
            name = ""
    return name or UNNAMED


def command_line_expert() -> str:
    """Who runs a CLI command: `$EVOPOOL_EXPERT`, else the login name."""
    return os.environ.get("EVOPOOL_EXPERT") or os.environ.get("USER") or os.environ.get("USERNAME") or ""
