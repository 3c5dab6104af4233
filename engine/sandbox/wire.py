"""The worker's reply channel: length-prefixed JSON frames on a dedicated pipe (not stdout), read with a deadline
and a size cap, so annotator output can neither forge nor flood a reply.

Each frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object). A run's votes travel
packed (`pack_votes`): one small signed integer per example, in base64, which every hop decodes and range-checks
without building a Python int per vote. A run's reply must carry
the nonce the parent sent for that run, and the parent sends it only after the worker has acknowledged the run
(`AWAITING_NONCE`), that is after the run's child was forked: a frame the annotator's process manages to put on
the pipe (a stale one, or a forgery through a descriptor it should not hold) cannot carry it and is refused.
"""
from __future__ import annotations

import array
import binascii
import hmac
import json
import os
import secrets
import select
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
AWAITING_SOURCE = {"ok": True, "awaiting": "source"}
AWAITING_NONCE = {"ok": True, "awaiting": "nonce"}
NONCE_HEX_CHARS = 32


def vote_code(n_labels: int) -> str:
    """The `array` type code that holds every vote of a task with `n_labels` labels (ABSTAIN = -1)."""
    return "b" if n_labels <= 127 else "h" if n_labels <= 32767 else "i"


def pack_votes(votes: list[int], n_labels: int) -> str:
    return binascii.b2a_base64(array.array(vote_code(n_labels), votes).tobytes(), newline=False).decode("ascii")


def unpack_votes(packed: object, n_labels: int) -> array.array:
    """The votes of a packed string; ValueError unless it is well-formed base64 of whole votes."""
    if not isinstance(packed, str):
        raise ValueError("votes are not a packed string")
    votes = array.array(vote_code(n_labels))
    votes.frombytes(binascii.a2b_base64(packed.encode("ascii"), strict_mode=True))  # ValueError if ragged
    return votes


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX_CHARS // 2)


def has_nonce(reply: dict[str, Any], nonce: str) -> bool:
    sent = reply.get("nonce")
    return isinstance(sent, str) and hmac.compare_digest(sent.encode(), nonce.encode())


class FrameError(RuntimeError):
    """No valid frame: end of stream, over the cap, not JSON, or the deadline passed (`timed_out`)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd: int, poller: select.poll, size: int, deadline: float, buf: bytearray) -> bytes:
    """`size` bytes from `fd` (taking what `buf` already holds first), or FrameError at the deadline or EOF."""
    while len(buf) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameError("deadline passed", timed_out=True)
        if poller.poll(max(1, int(left * 1000))):
            data = os.read(fd, max(1 << 16, size - len(buf)))
            if not data:
                raise FrameError("end of stream")
            buf += data
    out = bytes(buf[:size])
    del buf[:size]
    return out


class FrameReader:
    """Reads frames from one fd; keeps bytes of a partly read frame between calls."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buf = bytearray()
        self._poll = select.poll()  # not select(): a busy server may hand out fds above FD_SETSIZE
        self._poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def read(self, timeout_s: float, cap: int) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        (size,) = HEADER.unpack(read_exactly(self.fd, self._poll, HEADER.size, deadline, self._buf))
        if size > cap:
            raise FrameError(f"reply of {size} bytes is over the {cap}-byte cap")
        try:
            obj = json.loads(read_exactly(self.fd, self._poll, size, deadline, self._buf))
        except ValueError as exc:
            raise FrameError(f"reply is not JSON ({exc})") from None
        except (RecursionError, MemoryError) as exc:  # a frame of nested brackets: the writer's fault, not ours
            raise FrameError(f"reply is not JSON we parse ({type(exc).__name__})") from None
        if not isinstance(obj, dict):
            raise FrameError("reply is not a JSON object")
        return obj
