"""Cue mining for the offline proposer: which words, in which part of an example, point to which class.

A *view* (engine/text_views.py) is one part of an example reduced to lower-case words (the whole sentence,
the words between two entity mentions, the first words of a question, ...). A *cue* is a word (`bind`),
a word prefix (`inhibit*`) or a two-word phrase (`binds to`). The views compute exactly what the emitted
annotator code computes (templates.py renders the same logic), so a cue's fired rows can be counted
without running code.
"""
from __future__ import annotations

import bisect
from itertools import pairwise
from typing import Any, Sequence

import numpy as np
from scipy import sparse

from engine.text_views import view_text

MIN_PREFIX = 4  # shortest word prefix a cue may use ("bind*")
SUFFIX_LENGTHS = (3, 4)  # word endings mined on entity views ("*ase")
SUFFIX_VIEWS = ("entity1", "entity2")
SUFFIXES = (
    "ations", "ation", "ions", "ion", "ings", "ing", "ors", "or", "ers", "er", "ies", "es", "ed", "s",
    "ists", "ist", "isms", "ism", "ity", "ive", "ory", "ic", "al", "ly", "ment", "ments", "able", "e",
)


def dedupe_prefixes(cues: tuple[str, ...]) -> tuple[str, ...]:
    """Drop cues another prefix cue already covers (inhibitor when inhibit* is there)."""
    prefixes = [c[:-1] for c in cues if c.endswith("*")]
    kept = [c for c in cues if not any(c != p + "*" and c.startswith(p) for p in prefixes)]
    return tuple(kept)


def stems(word: str) -> set[str]:
    """Prefix cues a word suggests: the word itself and the word minus a common English suffix."""
    out = {word + "*"} if len(word) >= MIN_PREFIX else set()
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= MIN_PREFIX:
            out.add(word[: -len(suffix)] + "*")
    return out


def word_endings(word: str) -> list[str]:
    """Suffix cues a word suggests on entity views (`*ase` for enzymes, `*ine` for amines)."""
    return [f"*{word[-n:]}" for n in SUFFIX_LENGTHS if len(word) >= n + 2]


def cue_matches(cue: str, words: Sequence[str], joined: str) -> bool:
    """Reference semantics of one cue on a view (slow; used by tests and for foreign rows)."""
    if cue.startswith("*"):
        return any(w.endswith(cue[1:]) for w in words)
    if cue.endswith("*"):
        return any(w.startswith(cue[:-1]) for w in words)
    return f" {cue} " in f" {joined} "


class ViewIndex:
    """Binary row x cue matrices, one per view, over a fixed list of examples.

    Columns are exact words, two-word phrases and (when `with_prefixes`) word prefixes and, on entity
    views, word endings; a prefix column marks every row with a word starting with it (an ending column:
    ending with it), so column sums are exact fired counts of the cue regex.
    """

    def __init__(self, examples: Sequence[dict[str, Any]], views: Sequence[str], with_prefixes: bool = True):
        self.n_rows = len(examples)
        self.texts: dict[str, list[str]] = {}  # per indexed view, in the order indexed
        self.cues: dict[str, list[str]] = {}
        self.matrix: dict[str, sparse.csc_matrix] = {}
        self._vocab: dict[str, list[str]] = {}
        self._column: dict[str, dict[str, int]] = {}
        self._examples, self._with_prefixes = examples, with_prefixes
        for view in views:
            self.add_view(view)

    @property
    def views(self) -> tuple[str, ...]:
        """The views indexed so far."""
        return tuple(self.texts)

    def add_view(self, view: str) -> None:
        """Index one more view (a no-op when it is indexed): `fires` calls it, so an annotator reading a view
        nobody mines here (an LLM's, an expert's) fires where its code does."""
        if view in self.texts:
            return
        self.texts[view] = [view_text(ex, view) for ex in self._examples]
        self._build(view, self._with_prefixes)

    def _build(self, view: str, with_prefixes: bool) -> None:
        rows_words = [t.split() for t in self.texts[view]]
        vocab = sorted({w for ws in rows_words for w in ws})
        phrases = sorted({f"{a} {b}" for ws in rows_words for a, b in pairwise(ws)})
        prefixes = sorted({s for w in vocab for s in stems(w)}) if with_prefixes else []
        endings = sorted({e for w in vocab for e in word_endings(w)}) \
            if with_prefixes and view in SUFFIX_VIEWS else []
        cues = vocab + phrases + prefixes + endings
        col = {c: i for i, c in enumerate(cues)}
        r_idx: list[int] = []
        c_idx: list[int] = []
        for r, ws in enumerate(rows_words):
            feats = {col[w] for w in ws} | {col[f"{a} {b}"] for a, b in pairwise(ws)}
            r_idx.extend([r] * len(feats))
            c_idx.extend(feats)
        full = sparse.csr_matrix(
            (np.ones(len(r_idx), dtype=np.int32), (r_idx, c_idx)), shape=(self.n_rows, len(cues))
        )
        if prefixes or endings:  # derived column = OR over the vocabulary words the cue matches
            expand_r: list[int] = []
            expand_c: list[int] = []
            for p in prefixes:
                for i in self._prefix_range(vocab, p[:-1]):
                    expand_r.append(i)
                    expand_c.append(col[p])
            ending_set = set(endings)
            for i, w in enumerate(vocab):
                for n in range(1, len(w) + 1):
                    if f"*{w[-n:]}" in ending_set:
                        expand_r.append(i)
                        expand_c.append(col[f"*{w[-n:]}"])
            expand = sparse.csr_matrix(
                (np.ones(len(expand_r), dtype=np.int32), (expand_r, expand_c)), shape=(len(vocab), len(cues))
            )
            full = full + full[:, : len(vocab)] @ expand
            full.data[:] = 1
        self.cues[view] = cues
        self._vocab[view] = vocab
        self._column[view] = col
        self.matrix[view] = full.tocsc().astype(bool)

    @staticmethod
    def _prefix_range(vocab: list[str], stem: str) -> range:
        start = bisect.bisect_left(vocab, stem)
        end = bisect.bisect_left(vocab, stem + "\U0010ffff")
        return range(start, end)

    def column(self, view: str, cue: str) -> np.ndarray:
        """(n_rows,) bool fired mask of one cue, exact for any word, phrase or prefix cue."""
        out = np.zeros(self.n_rows, dtype=bool)
        col = self._column.get(view)
        if col is None:
            return out
        j = col.get(cue)
        if j is not None:
            out[self.matrix[view][:, j].indices] = True
        elif cue.startswith("*"):
            for i, w in enumerate(self._vocab[view]):
                if w.endswith(cue[1:]):
                    out[self.matrix[view][:, i].indices] = True
        elif cue.endswith("*"):
            for i in self._prefix_range(self._vocab[view], cue[:-1]):
                out[self.matrix[view][:, i].indices] = True
        elif " " in cue.strip() and cue.count(" ") > 1:
            texts = self.texts[view]
            out |= np.array([cue_matches(cue, t.split(), t) for t in texts], dtype=bool)
        return out  # an unseen word or two-word phrase fires nowhere

    def words(self, view: str) -> tuple[list[str], np.ndarray]:
        """The view's single words (indexed first if it is not yet) and on how many rows each occurs."""
        self.add_view(view)
        vocab = self._vocab[view]
        return vocab, np.asarray(self.matrix[view][:, : len(vocab)].sum(axis=0)).ravel()

    def fires(self, view: str, cues: Sequence[str]) -> np.ndarray:
        """(n_rows,) bool: rows where any of `cues` matches the view (indexed first if it is not yet)."""
        self.add_view(view)
        out = np.zeros(self.n_rows, dtype=bool)
        for cue in cues:
            out |= self.column(view, cue)
        return out


def class_counts(index: ViewIndex, view: str, onehot: np.ndarray) -> np.ndarray:
    """(n_cues, k) number of rows of each class on which each cue of `view` fires."""
    return np.asarray(index.matrix[view].T.astype(np.int32) @ onehot.astype(np.int32))


def smoothed_precision(correct: np.ndarray, fires: np.ndarray, prior: np.ndarray | float,
                       strength: float = 2.0) -> np.ndarray:
    """Precision shrunk toward the class prior, so a cue seen on few rows does not look perfect."""
    return (correct + strength * prior) / (fires + strength)
