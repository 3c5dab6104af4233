"""The embedder seam: texts in, L2-normalised float32 rows out; and the small helpers every embedder shares."""
from __future__ import annotations

import hashlib
from typing import Callable, Protocol, Sequence

import numpy as np

Progress = Callable[[int, int], None]


class Embedder(Protocol):
    """Texts in, (n, dim) float32 L2-normalised rows out. `name` keys the workspace cache, so two
    embedders that can give different vectors must have different names."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str], on_progress: Progress | None = None) -> np.ndarray: ...


def text_hash(text: str) -> str:
    """Cache key of one text (with the embedder name)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows as float32; an all-zero row stays zero instead of becoming NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
