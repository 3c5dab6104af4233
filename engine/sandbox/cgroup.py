"""One cgroup per sandbox worker: a memory cap and a process cap for the worker's whole tree (worker, init, holder
and every annotator run), and a way to kill all of it, so a fork or memory hog dies with its job.

The parent (root, before the worker starts) makes a child cgroup under its own one, in cgroup v2 where the
memory and pids controllers are delegated to it, else in the v1 `memory` and `pids` hierarchies; the worker
writes its own pid into the `cgroup.procs` files before it drops root (engine.sandbox.confine.join_cgroup), so
nothing it forks can start outside. The parent kills every process left in it and removes it when the worker ends.
Anywhere this is not possible (no root, no writable controller) `WorkerCgroup.create` says why and returns None.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "evopool-worker-"
_serial = itertools.count()


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller` ("" names the v2 hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(",") if controller else names == "":
            return path
    return None


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _remove_stale(parent: Path) -> None:
    """Directories left by a parent that was SIGKILLed: empty ones go (rmdir refuses a cgroup still in use)."""
    for stale in parent.glob(PREFIX + "*"):
        pid = stale.name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()


@dataclass
class WorkerCgroup:
    """The directories of one worker's cgroup (one per v1 controller, or one v2 directory) and its caps."""

    dirs: list[Path]
    version: int
    memory_bytes: int
    pids_max: int

    @property
    def procs_files(self) -> list[str]:
        """What the worker writes its pid into, before it drops root."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def describe(self) -> str:
        return (f"on: cgroup v{self.version}, the worker's whole process tree capped at "
                f"{self.memory_bytes >> 20} MiB and {self.pids_max} tasks, killed and removed with the worker")

    @classmethod
    def create(cls, memory_bytes: int, pids_max: int) -> tuple[WorkerCgroup | None, str]:
        """A fresh cgroup with both caps set, or None and "off: why"."""
        if os.geteuid() != 0:
            return None, "off: not root, so no cgroup can be made (rlimits, seccomp and the pid namespace hold)"
        name = f"{PREFIX}{os.getpid()}-{next(_serial)}-{time.monotonic_ns() % 10**9}"
        why_v2 = cls._v2_parent()
        if isinstance(why_v2, Path):
            try:
                return cls._make([why_v2 / name], 2, memory_bytes, pids_max), ""
            except OSError as exc:
                why_v2 = f"v2 refused ({exc.strerror or exc})"
        dirs = []
        for controller in ("memory", "pids"):
            own = _own_path(controller)
            base = CGROUP_ROOT / controller
            if own is None or not (base / "cgroup.procs").exists():
                return None, f"off: {why_v2}; no cgroup v1 {controller} hierarchy at {base}"
            dirs.append(base / own.lstrip("/") / name)
        try:
            return cls._make(dirs, 1, memory_bytes, pids_max), ""
        except OSError as exc:
            return None, f"off: {why_v2}; v1 refused ({exc.strerror or exc}) at {exc.filename or dirs[0]}"

    @staticmethod
    def _v2_parent() -> Path | str:
        """Our own v2 cgroup if it can hold children with memory and pids, else why not."""
        if not (CGROUP_ROOT / "cgroup.controllers").exists():
            return "no cgroup v2 hierarchy at /sys/fs/cgroup"
        own = _own_path("")
        if own is None:
            return "this process has no v2 cgroup"
        parent = CGROUP_ROOT / own.lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if not {"memory", "pids"} <= set(enabled):
                _write(parent / "cgroup.subtree_control", "+memory +pids")
        except OSError as exc:
            return f"memory and pids are not delegated to {parent} ({exc.strerror or exc})"
        return parent

    @classmethod
    def _make(cls, dirs: list[Path], version: int, memory_bytes: int, pids_max: int) -> WorkerCgroup:
        group = cls(dirs, version, memory_bytes, pids_max)
        try:
            for d in dirs:
                _remove_stale(d.parent)
                d.mkdir()
            if version == 2:
                _write(dirs[0] / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(dirs[0] / "memory.swap.max", "0")
                _write(dirs[0] / "pids.max", str(pids_max))
            else:
                _write(dirs[0] / "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(OSError):  # only where swap is accounted
                    _write(dirs[0] / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(dirs[1] / "pids.max", str(pids_max))
        except OSError:
            group.remove()
            raise
        return group

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in Path(procs).read_text().split())
        return found

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (a fork racing the kill is caught next round)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        for _ in range(100):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the directories (a cgroup goes once its last process is reaped)."""
        self.kill_all()
        for d in self.dirs:
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
