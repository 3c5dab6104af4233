"""Each annotator run's CPU-time budget inside the worker: a profiling-timer alarm that raises `Timeout` (which user
code catching `Exception` cannot swallow, and which is remembered if it does), and the kernel's CPU limit as a
backstop for C-level loops where Python signal handlers never run. Imported by the worker before it confines
itself (stdlib only)."""
from __future__ import annotations

import math
import resource
import signal


class Timeout(BaseException):
    """Raised by the CPU-time alarm; a BaseException so `except Exception` in user code does not eat it."""


class Alarm:
    """Per-annotator CPU-time alarm; `expired` survives user code that swallows the exception."""

    armed = False
    expired = False

    @classmethod
    def fire(cls, signum: int, frame: object) -> None:
        cls.expired = True
        if cls.armed:
            raise Timeout()

    @classmethod
    def start(cls, budget_s: float) -> None:
        cls.expired = False
        used = cpu_seconds()
        # Kernel backstop for C-level loops (e.g. sum over a huge range) where Python signal handlers never run.
        set_cpu_soft_limit(math.ceil(used + budget_s + 0.5))
        cls.armed = True
        signal.setitimer(signal.ITIMER_PROF, max(budget_s, 0.001), 0.05)

    @classmethod
    def stop(cls) -> None:
        cls.armed = False
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        set_cpu_soft_limit(None)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def set_cpu_soft_limit(seconds: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = hard if seconds is None else seconds
    if hard != resource.RLIM_INFINITY and soft > hard:
        soft = hard
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass
