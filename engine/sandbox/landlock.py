"""Landlock through ctypes: the worker gives up every filesystem access (before ABI 3 all but truncate, which
seccomp refuses), TCP bind/connect, and (ABI 6+) signals to and abstract sockets of processes outside its own
domain. Everything the worker needs was opened or imported before, so the ruleset allows nothing at all.

System calls 444-446 (landlock_create_ruleset, landlock_add_rule, landlock_restrict_self) are the same
number on every architecture that has them.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct

_CREATE_RULESET, _RESTRICT_SELF = 444, 446
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
# Filesystem rights by the ABI that introduced them (include/uapi/linux/landlock.h).
_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 where Landlock is missing or disabled."""
    got = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(got), 0)


def ruleset_attr(abi: int) -> bytes:
    """struct landlock_ruleset_attr for this ABI: every right it knows is handled, so all of them are denied."""
    fs = _FS_ABI1
    fs |= _FS_REFER if abi >= 2 else 0
    fs |= _FS_TRUNCATE if abi >= 3 else 0
    fs |= _FS_IOCTL_DEV if abi >= 5 else 0
    if abi >= 6:
        return struct.pack("QQQ", fs, _NET_BIND_TCP | _NET_CONNECT_TCP, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    if abi >= 4:
        return struct.pack("QQ", fs, _NET_BIND_TCP | _NET_CONNECT_TCP)
    return struct.pack("Q", fs)


def restrict_everything() -> str:
    """Enforce the deny-all ruleset on this process and its future children; the answer is for the report."""
    abi = abi_version()
    if abi < 1:
        return "off: Landlock is not available in this kernel"
    libc = _libc()
    attr = ruleset_attr(abi)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return f"off: ruleset refused ({errno.errorcode.get(ctypes.get_errno(), '?')}, ABI {abi})"
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_RESTRICT_SELF, int(fd), 0) != 0:
            return f"off: restrict_self refused ({errno.errorcode.get(ctypes.get_errno(), '?')}, ABI {abi})"
    finally:
        os.close(fd)
    files = "no file access" if abi >= 3 else "no file access but truncate (ABI < 3 has no truncate right)"
    parts = [files] + (["no TCP"] if abi >= 4 else []) + (["no signals out"] if abi >= 6 else [])
    return f"on: ABI {abi}, " + ", ".join(parts)
