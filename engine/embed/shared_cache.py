"""Sentence embeddings shared by every workspace of the user, by (embedder name, sha1 of the text).

A second workspace on the same texts (a re-import, a colleague's copy, the demo loaded twice) took as long to
embed as the first: minutes on a few thousand texts. Vectors are kept here in shard files, one per saved round,
each written whole under a temporary name then renamed, so a killed process leaves either the shard or nothing,
and two processes never write the same file. Where: `$EVOPOOL_CACHE` (`off` turns it off), else
`$XDG_CACHE_HOME/evopool`, else `~/.cache/evopool`.
"""
from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import numpy as np

OFF = "off"
_lock = threading.Lock()
# embedder folder -> {hash: (shard, row)}: an index of the shards read so far; vectors stay on disk (memory-mapped)
_index: dict[Path, dict[str, tuple[Path, int]]] = {}
_seen: dict[Path, set[str]] = {}  # embedder folder -> shard file names already indexed


def _record(dim: int) -> np.dtype:
    """One row of a shard: the text's sha1 (40 hex digits) and its vector."""
    return np.dtype([("hash", "S40"), ("vector", "<f4", (dim,))])


def cache_root() -> Path | None:
    """The user's cache folder, or None when the shared cache is off."""
    configured = os.environ.get("EVOPOOL_CACHE", "")
    if configured.strip().lower() == OFF:
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "evopool"


def _folder(embedder: str) -> Path | None:
    root = cache_root()
    return None if root is None else root / "embeddings" / embedder


def lookup(embedder: str, hashes: list[str]) -> dict[str, np.ndarray]:
    """The cached vectors among `hashes` (missing ones are left out). Shards written since the last call, by this
    process or another, are indexed first."""
    folder = _folder(embedder)
    if folder is None or not hashes or not folder.is_dir():
        return {}
    with _lock:
        index = _index.setdefault(folder, {})
        seen = _seen.setdefault(folder, set())
        for shard in sorted(folder.glob("*.npy")):
            if shard.name in seen:
                continue
            try:
                for row, key in enumerate(np.load(shard, mmap_mode="r")["hash"].tolist()):
                    index[key.decode("ascii")] = (shard, row)
            except (OSError, ValueError):  # unreadable (a disk fault): skip it, those texts are embedded again
                pass
            seen.add(shard.name)
        wanted: dict[Path, list[tuple[str, int]]] = {}
        for h in hashes:
            if h in index:
                shard, row = index[h]
                wanted.setdefault(shard, []).append((h, row))
    found: dict[str, np.ndarray] = {}
    for shard, rows in wanted.items():
        try:
            vectors = np.load(shard, mmap_mode="r")["vector"]
            found.update((h, np.array(vectors[row], dtype=np.float32)) for h, row in rows)
        except (OSError, ValueError):
            continue
    return found


def save(embedder: str, hashes: list[str], vectors: np.ndarray) -> None:
    """Add vectors to the shared cache. Best effort: a full disk or a read-only home never fails the labeling."""
    folder = _folder(embedder)
    if folder is None or not hashes:
        return
    vectors = np.asarray(vectors, dtype=np.float32)
    records = np.empty(len(hashes), dtype=_record(vectors.shape[1]))
    records["hash"] = [h.encode("ascii") for h in hashes]
    records["vector"] = vectors
    name = f"{uuid.uuid4().hex}.npy"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.partial"
        with open(partial, "wb") as out:
            np.save(out, records)
        os.replace(partial, folder / name)
    except OSError:
        return
    with _lock:
        index = _index.setdefault(folder, {})
        for row, h in enumerate(hashes):
            index[h] = (folder / name, row)
        _seen.setdefault(folder, set()).add(name)


def forget() -> None:
    """Drop what this process has read (tests that change `$EVOPOOL_CACHE`)."""
    with _lock:
        _index.clear()
        _seen.clear()
