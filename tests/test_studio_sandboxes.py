"""The studio's quick-run sandboxes: one expert's slow run does not hold up another's."""
from __future__ import annotations

import threading

import pytest

from engine.domain import Candidate
from engine.sandbox.annotators import make_annotator
from engine.sandbox.executor import SandboxExecutor
from studio.sandboxes import SandboxLeases

YES = "def annotate(example):\n    return 'yes'\n"
NO = "def annotate(example):\n    return 'no'\n"


def _annotator(source: str):
    return make_annotator(Candidate(source, "human", "test"), 0)


def test_a_second_run_gets_its_own_sandbox_while_the_first_runs_and_a_third_waits_for_one():
    """The first expert's run holds its sandbox (until `slow_may_end`, as a slow annotator would)."""
    leases = SandboxLeases(size=2)
    slow_started, slow_may_end, quick_done = threading.Event(), threading.Event(), threading.Event()
    votes: dict[str, list] = {}
    lent: dict[str, SandboxExecutor] = {}

    def slow_expert() -> None:
        with leases.lease() as sandbox:
            lent["slow"] = sandbox
            slow_started.set()
            votes["slow"] = sandbox.run([_annotator(YES)], [{"text": "a"}], ["yes", "no"])[0].votes.tolist()
            slow_may_end.wait(30)

    def quick_expert() -> None:
        with leases.lease() as sandbox:
            lent["quick"] = sandbox
            votes["quick"] = sandbox.run([_annotator(NO)], [{"text": "b"}], ["yes", "no"])[0].votes.tolist()
        quick_done.set()

    first = threading.Thread(target=slow_expert)
    first.start()
    assert slow_started.wait(30)
    second = threading.Thread(target=quick_expert)
    second.start()
    assert quick_done.wait(60), "the quick run waited behind the slow one"  # its own sandbox: not blocked
    assert votes["quick"] == [1] and leases.started == 2 and lent["quick"] is not lent["slow"]

    # both lent: a third lease waits until one comes back, then reuses it (no third sandbox started)
    with leases.lease() as sandbox:  # the quick expert's, returned
        third_started = threading.Event()
        third_done = threading.Event()

        def third_expert() -> None:
            with leases.lease():
                third_started.set()
            third_done.set()

        waiting = threading.Thread(target=third_expert)
        waiting.start()
        assert not third_started.wait(0.5)  # both sandboxes are lent
        slow_may_end.set()
        assert third_done.wait(30)
        assert sandbox is lent["quick"]
    first.join(30)
    second.join(30)
    waiting.join(30)
    assert votes["slow"] == [0] and leases.started == 2
    leases.close()  # both back and idle: their workers stop, and none counts as started
    assert leases.started == 0


def test_a_sandbox_that_fails_to_start_frees_its_place():
    calls = []

    def broken() -> SandboxExecutor:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("no worker")
        return SandboxExecutor(workers=1)

    leases = SandboxLeases(size=1, make=broken)
    with pytest.raises(OSError), leases.lease():
        pass
    assert leases.started == 0
    with leases.lease() as sandbox:  # would wait for ever had the failed start kept its place
        assert isinstance(sandbox, SandboxExecutor)
    leases.close()
    with pytest.raises(ValueError):
        SandboxLeases(size=0)


def test_clearing_the_studio_cache_stops_the_idle_sandboxes_workers():
    """The server's leases are a cached resource: "Clear cache" (or a new version of the function) drops them, and
    their idle workers must stop with them rather than live on unreachable until the server exits."""
    from studio import editor

    editor._quick_sandboxes.clear()
    with editor.sandbox() as sandbox:
        assert [r.votes.tolist() for r in sandbox.run([_annotator(YES)], [{"text": "x"}], ["no", "yes"])] == [[1]]
        worker = next(w for w in sandbox._workers if w is not None)
    assert worker.proc.poll() is None  # idle and warm
    editor._quick_sandboxes.clear()
    assert worker.proc.wait(timeout=10) is not None
