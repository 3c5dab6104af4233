"""Words of like meaning, from the packaged MiniLM: knowledge beyond the dev rows for the offline agents.

A curator who reads the class name "Content-Container" writes "box, bottle, jar, suitcase, bucket" as the
container's words without looking at a single labeled row; an LLM does the same. The offline agents ask the
static word table distilled from MiniLM (engine/embed/static.py) which words of a view's vocabulary (the unlabeled
pool sample's, or dev's text where there is no sample: no label is read) lie nearest a label's word. On
SemEval's second entity, "container" is nearest "pod, box, vessel, glass, chamber, jar, bottle, bucket, suitcase"
(read ad hoc on the train rows: most of their rows are Content-Container). Words near a vague name ("entity",
"message") are a grab bag; the gate's dev check turns those banks away like any other weak candidate.
"""
from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.agents.offline.cues import ViewIndex

WORD_EMBEDDER = "static"  # ~15k words/s here; MiniLM itself ranks single words no better (read ad hoc)
MIN_ROWS = 2  # a word must occur on this many rows of the index: a one-off spelling is no cue to widen with
MIN_SIMILARITY = 0.2  # cosine in the static table; below it the nearest words of a name are unrelated
# index -> view -> (vocabulary words, their unit vectors): a view's vocabulary is embedded once per sample
_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@functools.cache
def _embedder():
    """The one embedder: each new one loads its tokenizer again (30 ms a word when banks were first built)."""
    from engine.embed.registry import get_embedder

    return get_embedder(WORD_EMBEDDER)


def _embed(words: list[str]) -> np.ndarray:
    """Unit vectors (the static embedder's rows are normalised already)."""
    return np.asarray(_embedder().encode(words), dtype=np.float32)


@functools.lru_cache(maxsize=4096)
def _query(word: str) -> np.ndarray:
    """A label word's vector (a task has a few dozen words, asked again for every view and proposal)."""
    return _embed([word])[0]


def _vocabulary(index: ViewIndex, view: str) -> tuple[list[str], np.ndarray]:
    per_view = _tables.setdefault(index, {})
    if view not in per_view:
        words, rows = index.words(view)
        kept = [w for w, n in zip(words, rows, strict=True) if n >= MIN_ROWS and len(w) >= 3 and w.isalpha()]
        per_view[view] = (kept, _embed(kept) if kept else np.zeros((0, 1), dtype=np.float32))
    return per_view[view]


def nearest_words(index: ViewIndex, view: str, word: str, limit: int) -> list[str]:
    """Up to `limit` words of `view`'s vocabulary in `index` nearest `word` by meaning (the word itself excluded),
    nearest first, each at least MIN_SIMILARITY away from unrelated."""
    vocab, vectors = _vocabulary(index, view)
    if not vocab or limit <= 0:
        return []
    similarity = vectors @ _query(word)
    order = np.argsort(-similarity, kind="stable")
    return [vocab[i] for i in order[: limit + 1] if similarity[i] >= MIN_SIMILARITY and vocab[i] != word][:limit]
