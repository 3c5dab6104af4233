"""How votes are packed: one BLOB of small integer codes per (annotator, chunk of rows).

A row's place in the votes is its import position (`examples.ord`), which never changes: the expert moving a
row from the pool into dev changes its split, not its place, so nothing stored here goes stale when splits
change. Chunk `c` holds rows `c * CHUNK_ROWS ... (c + 1) * CHUNK_ROWS - 1`; its BLOB may be shorter (a small
or growing workspace), and a row past its end, or in a chunk with no BLOB, abstains. Codes are the votes
themselves (ABSTAIN = -1) as little-endian int8, or int16 / int32 when an annotator votes for a class past
127 / 32767 (`width` bytes each), deflated (zlib level 1: an annotator abstains on most rows, so a 64 KiB chunk
firing on 8 % of its rows deflates to ~11 KiB in ~0.5 ms). Pure numpy and zlib: no duckdb here.
"""
from __future__ import annotations

import zlib

import numpy as np

from engine.domain import ABSTAIN

CHUNK_ROWS = 65536  # rows per BLOB: 64 KiB at int8. Changing it needs a migration that re-packs the votes
_DTYPES: dict[int, np.dtype[np.signedinteger]] = {1: np.dtype("<i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4")}


def width_for(votes: np.ndarray) -> int:
    """Bytes per code that hold every vote in `votes` (1 unless a class id passes 127)."""
    if votes.size == 0:
        return 1
    top, bottom = int(votes.max()), int(votes.min())
    if bottom < ABSTAIN:
        raise ValueError(f"a vote is a class id or ABSTAIN ({ABSTAIN}), not {bottom}")
    return next(w for w, dtype in _DTYPES.items() if top <= np.iinfo(dtype).max)


def decode(blob: bytes, width: int) -> np.ndarray:
    """A chunk's codes as a read-only array."""
    return np.frombuffer(zlib.decompress(blob), dtype=_DTYPES[width])


def encode(codes: np.ndarray, width: int) -> bytes:
    return zlib.compress(np.ascontiguousarray(codes, dtype=_DTYPES[width]).tobytes(), 1)


def split_by_chunk(ords: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """chunk -> (positions into `ords`, offsets within the chunk) for every chunk the rows `ords` fall in."""
    ords = np.asarray(ords, dtype=np.int64)
    if ords.size == 0:
        return {}
    chunks = ords // CHUNK_ROWS
    steps = np.diff(chunks)
    if (steps >= 0).all():  # a split's rows come in import order: no sort needed
        order, bounds = np.arange(len(ords)), np.flatnonzero(steps) + 1
    else:
        order = np.argsort(chunks, kind="stable")
        bounds = np.flatnonzero(np.diff(chunks[order])) + 1
    out = {}
    for positions in np.split(order, bounds):
        out[int(chunks[positions[0]])] = (positions, ords[positions] % CHUNK_ROWS)
    return out


def patch(codes: np.ndarray | None, width: int, clear: np.ndarray, offsets: np.ndarray,
          votes: np.ndarray) -> tuple[np.ndarray, int]:
    """A chunk's codes (None: no BLOB yet) with the rows at `clear` set to ABSTAIN and then the rows at
    `offsets` set to `votes`; grown (with ABSTAIN) to reach every row written, widened when a vote needs it.
    Returns (codes, width); the codes are trimmed of trailing abstains (all abstain: length 0)."""
    width = max(width, width_for(votes))
    reach = max(int(offsets.max()) + 1 if offsets.size else 0, 0 if codes is None else len(codes))
    out = np.full(reach, ABSTAIN, dtype=_DTYPES[width])
    if codes is not None:
        out[:len(codes)] = codes
    out[clear[clear < reach]] = ABSTAIN
    out[offsets] = votes
    fired = np.flatnonzero(out != ABSTAIN)
    return out[:fired[-1] + 1 if fired.size else 0], width
