"""The worker confines itself before it reads any annotator, so the operating system holds the line even when
annotator code beats the checker and runs arbitrary Python (or raw system calls through ctypes).

Layers, each applied best-effort and reported as "on: ..." or "off: why" (never silently skipped):
  uid          root switches to nobody (65534) with no groups; others keep their own uid and say so
  namespaces   new user, mount, pid, network (only a down loopback), ipc, uts (a fixed host name), cgroup and
               time (the runs' clocks start at 0)
  filesystem   the root becomes an empty read-only tmpfs: no app files, no /proc, no /dev, nothing to exec
  capabilities every capability dropped, bounding and ambient sets emptied
  rlimits      address space, no file writes, no core files, few descriptors
  landlock     no file access, no TCP, no signals out of the domain (kernel ABI permitting)
  seccomp      BASE filter (engine.sandbox.seccomp); each annotator's child adds the RUN filter
  cgroup       joined first (made by the parent, engine.sandbox.cgroup): memory and task caps for the whole tree
Everything the worker runs was imported before this, so it needs no file afterwards.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal
import time

from engine.sandbox import landlock, seccomp

NOBODY = 65534
HOSTNAME = b"sandbox"
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x80
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # no libc wrapper; the number is per architecture
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT = 1, 4, 24, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

Report = dict[str, str]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _err() -> str:
    return errno.errorcode.get(ctypes.get_errno(), "?")


def drop_to_nobody() -> str:
    """Root becomes nobody; the kernel then checks every file, signal and ptrace against uid 65534."""
    if os.geteuid() != 0:
        return f"off: not started as root, so it keeps uid {os.geteuid()} (cannot switch to nobody)"
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    return f"on: uid and gid {NOBODY} (nobody), no supplementary groups"


def enter_namespaces() -> str:
    """New namespaces for this process (pid: for its children); our uid maps to itself and nothing else."""
    uid, gid = os.geteuid(), os.getegid()
    _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # after a uid change /proc/self/uid_map must be ours to write
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
    # cgroup and time namespaces where the kernel has them (time: Linux 5.6), the rest without them
    for extra in (_CLONE_NEWCGROUP | _CLONE_NEWTIME, _CLONE_NEWCGROUP, 0):
        if _libc().unshare(flags | extra) == 0:
            break
    else:
        return f"off: unshare refused ({_err()}); user namespaces may be disabled on this machine"
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    libc = _libc()  # uname would name the host otherwise
    named = libc.sethostname(HOSTNAME, len(HOSTNAME)) == 0 and libc.setdomainname(b"(none)", 6) == 0
    uts = f"uts (host name {HOSTNAME.decode()})" if named else f"uts (sethostname refused: {_err()})"
    clocks = _restart_clocks() if extra & _CLONE_NEWTIME else "no time namespace (the host's uptime shows)"
    return f"on: user, mount, pid, network (loopback down, no other interface), ipc, {uts}, {clocks}"


def _restart_clocks() -> str:
    """The children's monotonic and boot clocks start near 0, so a run cannot read how long the host has been up.
    Offsets can be set only before the first child enters the new time namespace, which is now."""
    offsets = "".join(f"{name} {1 - int(time.clock_gettime(clock))} 0\n"
                      for name, clock in (("monotonic", time.CLOCK_MONOTONIC), ("boottime", time.CLOCK_BOOTTIME)))
    try:
        with open("/proc/self/timens_offsets", "w") as fh:
            fh.write(offsets)
    except OSError as err:
        return f"time (the host's uptime shows: offsets refused, {err.strerror})"
    return "time (the clocks of its runs start at 0: no host uptime)"


def empty_root() -> str:
    """Pivot into an empty tmpfs, drop the old root, make the new one read-only."""
    libc = _libc()
    pivot_root = _SYS_PIVOT_ROOT.get(platform.machine())
    if pivot_root is None:
        return f"off: no pivot_root number known for {platform.machine()}"
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"off: cannot make mounts private ({_err()})"
    target = b"/tmp" if os.path.isdir("/tmp") else b"/mnt"
    opts = b"size=4k,nr_inodes=4,mode=0555"
    if libc.mount(b"tmpfs", target, b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts) != 0:
        return f"off: cannot mount an empty tmpfs ({_err()})"
    os.chdir(target)
    if libc.syscall(pivot_root, b".", b".") != 0:
        return f"off: pivot_root refused ({_err()})"
    if libc.umount2(b".", _MNT_DETACH) != 0:
        return f"off: old root still attached ({_err()})"
    os.chdir("/")
    ro = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    readonly = libc.mount(None, b"/", None, ro, None) == 0
    left = os.listdir("/")
    if left:
        return f"off: the new root is not empty ({left[:3]})"
    return "on: empty tmpfs root" + (" (read-only)" if readonly else " (writable: read-only remount refused)") + \
        ", no app files, no /proc, no /dev"


def drop_capabilities() -> str:
    """Empty the bounding, ambient, effective, permitted and inheritable sets."""
    libc = _libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:
        return f"off: capset refused ({_err()})"
    libc.capget(ctypes.byref(header), ctypes.byref(data))
    if any(data):
        return "off: capabilities remain after capset"
    return "on: every capability dropped (effective, permitted, inheritable, bounding, ambient)"


def apply_rlimits(memory_mb: int) -> str:
    """Kernel limits inherited by every annotator run; each is skipped where the platform refuses it."""
    limits = [
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024),
        (resource.RLIMIT_FSIZE, 0),  # no file writes
        (resource.RLIMIT_CORE, 0),  # SIGXCPU must not leave core files behind
        (resource.RLIMIT_NOFILE, 16),
    ]
    names = {resource.RLIMIT_AS: "address space", resource.RLIMIT_FSIZE: "file size", resource.RLIMIT_CORE: "core",
             resource.RLIMIT_NOFILE: "descriptors"}
    refused = []
    for res, value in limits:
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            refused.append(names[res])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past FSIZE fails instead of killing us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # partly refused is not "on": a required layer must not pass for one that is missing a limit
    held = f"{memory_mb} MiB address space, no file writes, 16 descriptors"
    return f"off: refused {', '.join(refused)} (wanted {held})" if refused else f"on: {held}"


def join_cgroup(procs_files: list[str]) -> str:
    """Move this process into the cgroup the parent made for it, while it is still root, before any fork."""
    if not procs_files:
        return "off: the parent made no cgroup for this worker"
    try:
        for procs in procs_files:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
    except OSError as exc:
        return f"off: cannot join {procs} ({exc.strerror or exc})"
    return f"on: joined {len(procs_files)} cgroup director{'y' if len(procs_files) == 1 else 'ies'}"


def die_with_parent() -> None:
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def confine(memory_mb: int, cgroup_procs: list[str] | None = None) -> Report:
    """Every layer, in the order that lets each be set up; the worker forks its init right after."""
    report: Report = {"cgroup": join_cgroup(cgroup_procs or [])}
    report |= {"uid": drop_to_nobody(), "namespaces": enter_namespaces()}
    report["filesystem"] = empty_root() if report["namespaces"].startswith("on") else \
        "off: no mount namespace, so the app's files stay visible (Landlock must hold alone)"
    report["rlimits"] = apply_rlimits(memory_mb)
    report["capabilities"] = drop_capabilities()
    report["landlock"] = landlock.restrict_everything()
    report["seccomp"] = seccomp.install_base()
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no other process of this uid may ptrace or read us
    return report
