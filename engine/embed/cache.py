"""Sentence embeddings, cached in the workspace by (embedder name, sha1 of the text).

EvoAgg and the studio need one vector per row; embedding is the slowest step of labeling, so every
vector is computed once per workspace and saved as it is produced (a killed job keeps what it did), and
once per user: `shared_cache.py` hands a new workspace the vectors another one computed.
The models live in `minilm.py` (the packaged all-MiniLM-L6-v2, exact / bf16 / int8) and `static.py`
(a static token table distilled from it), named in `registry.py`. Nothing here touches the network.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from engine.embed import shared_cache
from engine.embed.base import Embedder, Progress, text_hash
from engine.embed.registry import get_embedder

if TYPE_CHECKING:
    from engine.store.workspace import Store

SAVE_EVERY = 1024  # texts per encode + save round: bounds lost work and gives steady progress


def embed_texts(store: Store, texts: Sequence[str], embedder: Embedder,
                on_progress: Progress | None = None) -> np.ndarray:
    """(len(texts), dim) embeddings in `texts` order, computing only texts the workspace lacks.

    Identical texts are embedded once. Progress counts distinct texts: cached ones are done at once,
    the rest as they are encoded; the last call is always (total, total).
    """
    position: dict[str, int] = {}  # distinct text -> its index, first occurrence order
    inverse = np.fromiter((position.setdefault(t, len(position)) for t in texts), dtype=np.int64, count=len(texts))
    hashes = [text_hash(t) for t in position]  # each distinct text hashed once
    unique: dict[str, str] = dict(zip(hashes, position, strict=True))  # hash -> text
    total = len(unique)
    found = store.cached_embeddings(embedder.name, list(unique)) if unique else {}
    missing = [h for h in unique if h not in found]
    shared = shared_cache.lookup(embedder.name, missing)  # embedded for another workspace of this user
    if shared:
        keys = list(shared)
        for start in range(0, len(keys), SAVE_EVERY):
            part = keys[start:start + SAVE_EVERY]
            store.save_embeddings(embedder.name, part, np.stack([shared[h] for h in part]))
        found.update(shared)
        missing = [h for h in missing if h not in shared]
    # Longest first (by characters, a cheap proxy for tokens): each saved round holds texts of similar
    # length, so the embedder pads little, and the slow rounds come first while estimates are young.
    missing.sort(key=lambda h: -len(unique[h]))
    done = total - len(missing)
    if on_progress is not None:
        on_progress(done, total)
    for start in range(0, len(missing), SAVE_EVERY):
        chunk = missing[start:start + SAVE_EVERY]
        base = done

        def chunk_progress(chunk_done: int, chunk_total: int, base: int = base) -> None:
            if on_progress is not None and chunk_done < chunk_total:  # the end is reported after saving
                on_progress(base + chunk_done, total)

        vectors = embedder.encode([unique[h] for h in chunk], on_progress=chunk_progress)
        if vectors.shape != (len(chunk), embedder.dim):
            raise ValueError(f"embedder {embedder.name!r} returned shape {vectors.shape}, "
                             f"expected {(len(chunk), embedder.dim)}")
        vectors = np.asarray(vectors, dtype=np.float32)
        store.save_embeddings(embedder.name, chunk, vectors)
        shared_cache.save(embedder.name, chunk, vectors)
        found.update(zip(chunk, vectors, strict=True))
        done += len(chunk)
        if on_progress is not None:
            on_progress(done, total)
    if not hashes:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    vectors = np.stack([found[h] for h in hashes]).astype(np.float32, copy=False)
    return vectors if len(hashes) == len(texts) else vectors[inverse]


def embed_split(store: Store, split: str, embedder: Embedder | None = None,
                on_progress: Progress | None = None) -> tuple[list[str], np.ndarray]:
    """(example ids, embeddings) of one split, rows in the store's import order."""
    frame = store.examples_frame(split)
    embedder = embedder if embedder is not None else get_embedder()
    return [str(i) for i in frame["id"]], embed_texts(store, list(frame["text"]), embedder, on_progress)
