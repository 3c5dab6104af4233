"""A seccomp filter written by hand (classic BPF through ctypes): the kernel refuses the system calls that would
let annotator code reach past its own process, whatever Python it manages to run.

Two stacked filters: `BASE` for the whole worker (no execve, sockets, ptrace, other processes' memory, mounts,
namespaces, kernel keyrings, bpf, io_uring, nor a SIGIO owner set with fcntl), and `RUN` added by each
per-annotator child on top (no new processes or programs, no signals to anyone, no new session, and the calls that
set limits, priority or CPUs only on the caller itself: the holder and the init share its uid, and every later run
inherits what they are set to). x86_64 only; elsewhere `Filter.load` says it is unavailable.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
BASE: dict[str, int] = {
    "execve": 59, "execveat": 322, "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50,
    "accept": 43, "accept4": 288, "sendto": 44, "sendmsg": 46, "sendmmsg": 307, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312, "mount": 165,
    "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168,
    "acct": 163, "quotactl": 179, "setuid": 105, "setgid": 106, "setreuid": 113, "setregid": 114,
    "setresuid": 117, "setresgid": 119, "setgroups": 116, "capset": 126, "personality": 135,
    "mknod": 133, "mknodat": 259, "memfd_create": 319, "process_madvise": 440, "seccomp": 317,
    # the mount table without a path (Landlock does not see these); truncate, which Landlock before ABI 3 does
    # not cover; the host's memory and load, and host-wide writeback; times, whose return value counts the host's
    # clock ticks since boot (no time namespace covers it)
    "statmount": 457, "listmount": 458, "truncate": 76, "ftruncate": 77, "sysinfo": 99, "sync": 162, "syncfs": 306,
    "times": 100,
}
RUN: dict[str, int] = {
    "fork": 57, "vfork": 58, "clone": 56, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
    "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424, "setsid": 112, "setpgid": 109,
    "prctl": 157, "ioctl": 16, "msgget": 68, "semget": 64, "shmget": 29, "mq_open": 240,
    "execve": 59, "execveat": 322,  # also in BASE; repeated so this filter holds on its own
}
_ENOSYS_IN_RUN = {"clone3": 435}  # ENOSYS, not EPERM: glibc then falls back to clone, which RUN refuses
# calls that may name another process (same uid: the holder and the init, pid 1 of the child's namespace, whose
# limits, priority and CPUs every later run inherits): allowed in RUN only on the caller itself. Each is (nr,
# conditions), a condition (argument index, the one value allowed): the pid argument is 0, as glibc's setrlimit /
# nice / sched_* calls pass it; setpriority and ioprio_set also need `which` to name a process, since with
# PRIO_PGRP / PRIO_USER (IOPRIO_WHO_PGRP / _USER) who == 0 means the caller's process group or uid, the holder too
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
SELF_ONLY_IN_RUN: dict[str, tuple[int, tuple[tuple[int, int], ...]]] = {
    "prlimit64": (302, ((0, 0),)), "setpriority": (141, ((0, _PRIO_PROCESS), (1, 0))),
    "sched_setparam": (142, ((0, 0),)), "sched_setscheduler": (144, ((0, 0),)),
    "sched_setaffinity": (203, ((0, 0),)), "sched_setattr": (314, ((0, 0),)),
    "ioprio_set": (251, ((0, _IOPRIO_WHO_PROCESS), (1, 0))), "migrate_pages": (256, ((0, 0),)),
    "move_pages": (279, ((0, 0),)),
}
# calls refused in BASE only for some values of one argument: (nr, argument index, values), the argument's low 32 bits
# compared (the kernel reads these as int). fcntl's F_SETOWN, F_SETSIG, F_SETOWN_EX with O_ASYNC have the kernel
# signal any process of the uid for us (SIGIO), past every "no signals" rule
BASE_IF: dict[str, tuple[int, int, tuple[int, ...]]] = {"fcntl": (72, 1, (8, 10, 15))}
_ARGS_OFFSET = 16  # struct seccomp_data: nr (4), arch (4), instruction_pointer (8), then six 64-bit arguments


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(deny: dict[str, int], enosys: dict[str, int] | None = None,
            self_only: dict[str, tuple[int, tuple[tuple[int, int], ...]]] | None = None,
            deny_if: dict[str, tuple[int, int, tuple[int, ...]]] | None = None) -> bytes:
    """Wrong architecture or x32 ABI: kill; a listed call: EPERM (or ENOSYS); a `self_only` call (nr, conditions):
    allowed when each condition's argument (all 64 bits) equals its value, else EPERM; a `deny_if` call (nr,
    argument index, values): EPERM when that argument's low 32 bits are one of the values; anything else: allowed."""
    out = [_insn(_LD_W_ABS, 0, 0, 4), _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64), _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
           _insn(_LD_W_ABS, 0, 0, 0), _insn(_JGE_K, 0, 1, _X32_BIT), _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for table, err in ((deny, errno.EPERM), (enosys or {}, errno.ENOSYS)):
        for nr in sorted(set(table.values())):
            out += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, _RET_ERRNO | err)]
    for nr, conditions in sorted(set((self_only or {}).values())):
        refuse = 4 * len(conditions) + 1  # the refusal's place counted from the block's first load
        out.append(_insn(_JEQ_K, 0, refuse + 1, nr))  # another call: skip this block
        for i, (arg, value) in enumerate(conditions):
            low = _ARGS_OFFSET + 8 * arg  # little endian: the low 32 bits first, then the high ones
            out += [_insn(_LD_W_ABS, 0, 0, low), _insn(_JEQ_K, 0, refuse - 4 * i - 2, value),
                    _insn(_LD_W_ABS, 0, 0, low + 4), _insn(_JEQ_K, 0, refuse - 4 * i - 4, 0)]
        out += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    for nr, arg, values in sorted((deny_if or {}).values()):
        out += [_insn(_JEQ_K, 0, len(values) + 3, nr), _insn(_LD_W_ABS, 0, 0, _ARGS_OFFSET + 8 * arg)]
        out += [_insn(_JEQ_K, len(values) - j, 0, value) for j, value in enumerate(values)]
        out += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    out.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def available() -> bool:
    return platform.machine() == "x86_64"


class Filter:
    """A filter built once (the worker builds RUN ahead) so loading it in a fresh child is one prctl."""

    def __init__(self, deny: dict[str, int], enosys: dict[str, int] | None = None,
                 self_only: dict[str, tuple[int, tuple[tuple[int, int], ...]]] | None = None,
                 deny_if: dict[str, tuple[int, int, tuple[int, ...]]] | None = None):
        self.count = len(set(deny.values()) | set((enosys or {}).values()))
        self.self_only = len(self_only or {})
        self.deny_if = len(deny_if or {})
        self._libc = ctypes.CDLL(None, use_errno=True)
        code = program(deny, enosys, self_only, deny_if)
        self._buf = ctypes.create_string_buffer(code, len(code))
        self._prog = _SockFprog(len(code) // 8, ctypes.cast(self._buf, ctypes.c_void_p))

    def load(self) -> str:
        """Load into this process (and its future children); the answer is for the containment report.

        Sets PR_SET_NO_NEW_PRIVS first, which seccomp requires of a process without CAP_SYS_ADMIN.
        """
        if not available():
            return f"off: no filter for {platform.machine()} (x86_64 only)"
        if self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"off: no_new_privs refused ({errno.errorcode.get(ctypes.get_errno(), '?')})"
        if self._libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self._prog), 0, 0) != 0:
            return f"off: filter refused ({errno.errorcode.get(ctypes.get_errno(), '?')})"
        return f"on: {self.count} system calls refused" + (
            f", {self.self_only} allowed on the caller only" if self.self_only else "") + (
            f", {self.deny_if} refused for some arguments" if self.deny_if else "")


def install_base() -> str:
    """The worker's filter: BASE, and fcntl refused the commands that make the kernel signal for us."""
    return Filter(BASE, deny_if=BASE_IF).load()


def run_filter() -> Filter:
    """The per-annotator child's extra filter: no processes, no signals, no new sessions, and no changing another
    process's limits, priority or CPUs."""
    return Filter(RUN, _ENOSYS_IN_RUN, SELF_ONLY_IN_RUN)

