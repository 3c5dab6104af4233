"""The words of many rows at once, dictionary-encoded, so a compiled annotator's cues cost a vocabulary lookup and
a gather instead of a scan of the text per annotator.

A chunk's text is one byte buffer, one byte per character, in which exactly the characters `normalise` keeps as
word characters are ASCII letters and digits (engine.apply.compiled builds it: any other character is a
separator byte). A word is a maximal run of such bytes, lower-cased. `Runs` finds every run of the buffer and
numbers the distinct ones (Arrow's dictionary_encode), once per buffer. A view of each row is a byte range of
that buffer and an optional window (its first or last k words): `Runs.view(lo, hi, keep)` gives its words as
ids, in order, row after row; a word the range cuts (a span boundary inside a word) is a word of its own, with
an id past the vocabulary.

A cue (engine.apply.compiled.needle: whole words, a `*` letting the word go on) becomes one test per cue word
on the vocabulary (equal / starts with / ends with / contains). `ViewWords.hits` answers many cue sets in one
gather: each vocabulary word gets a bit per set it passes, and each row ORs its words' bits.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_WORD = bytes(range(ord("a"), ord("z") + 1)) + bytes(range(ord("A"), ord("Z") + 1)) + b"0123456789"
_IS_WORD = bytes(1 if c in _WORD else 0 for c in range(256))  # translate table: a word byte -> 1, else 0
_NOT_WORD = bytes(c for c in range(256) if c not in _WORD)  # deleted, so the words come out back to back
_LOWER = bytes(c + 32 if ord("A") <= c <= ord("Z") else c for c in range(256))

EXACT, PREFIX, SUFFIX, INFIX = "exact", "prefix", "suffix", "infix"
_MODE = {(False, False): EXACT, (False, True): PREFIX, (True, False): SUFFIX, (True, True): INFIX}
SETS_PER_PASS = 64  # cue sets answered by one gather (bits of a uint64)


def cue_terms(cue: str) -> tuple[tuple[bytes, str], ...]:
    """The (word, mode) tests a cue's consecutive words must pass, equivalent to finding `needle(cue)` in the
    padded row b" w1 w2 ... ": a leading `*` lets the first word start earlier (suffix), a trailing one lets the
    last word go on (prefix); inner words are whole."""
    lead, trail = cue.startswith("*"), cue.endswith("*")
    words = [w.encode("ascii") for w in cue.strip("*").split(" ")]
    if len(words) == 1:
        return ((words[0], _MODE[(lead, trail)]),)
    first, *inner, last = words
    return ((first, SUFFIX if lead else EXACT), *((w, EXACT) for w in inner), (last, PREFIX if trail else EXACT))


def _bools(array: pa.Array) -> np.ndarray:
    """An Arrow boolean array as numpy, from its bitmap (Array.to_numpy would import pandas)."""
    if array.null_count:
        array = pc.fill_null(array, False)
    bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[array.offset:array.offset + len(array)].astype(bool)


def _matches(word: bytes, mode: str, candidate: bytes) -> bool:
    if mode == EXACT:
        return candidate == word
    if mode == PREFIX:
        return candidate.startswith(word)
    if mode == SUFFIX:
        return candidate.endswith(word)
    return word in candidate


class Runs:
    """Every word of one byte buffer (see the module's docstring): start, end and vocabulary id of each, in order."""

    def __init__(self, data: bytes):
        self.data = data
        is_word = np.frombuffer(data.translate(_IS_WORD), dtype=np.bool_)
        edges = np.flatnonzero(np.diff(is_word, prepend=False, append=False))  # alternately starts and ends
        self.starts, self.ends = np.ascontiguousarray(edges[0::2]), np.ascontiguousarray(edges[1::2])
        offsets = np.zeros(len(self.starts) + 1, dtype=np.int64)
        np.cumsum(self.ends - self.starts, out=offsets[1:])
        words = pa.Array.from_buffers(pa.large_binary(), len(self.starts),
                                      [None, pa.py_buffer(offsets), pa.py_buffer(data.translate(_LOWER, _NOT_WORD))])
        encoded = pc.dictionary_encode(words)
        indices = encoded.indices  # int32, no nulls: read from its buffer (to_numpy would import pandas)
        self.ids = np.frombuffer(indices.buffers()[1], dtype=np.int32)[indices.offset:indices.offset + len(indices)]
        self.vocab: pa.Array = encoded.dictionary
        self._tables: dict[tuple[bytes, str], np.ndarray] = {}
        self._vocab_lengths: np.ndarray | None = None

    def table(self, word: bytes, mode: str) -> np.ndarray:
        """(len(vocab),) bool: the vocabulary words that pass (word, mode)."""
        key = (word, mode)
        if key not in self._tables:
            if len(self.vocab) == 0:
                found = np.zeros(0, dtype=bool)
            elif mode == EXACT:  # starts with it and is as long (pa.scalar would import pandas)
                found = _bools(pc.starts_with(self.vocab, pattern=word)) & (self._lengths() == len(word))
            else:
                kernel = {PREFIX: pc.starts_with, SUFFIX: pc.ends_with, INFIX: pc.match_substring}[mode]
                found = _bools(kernel(self.vocab, pattern=word))
            self._tables[key] = found
        return self._tables[key]

    def _lengths(self) -> np.ndarray:
        """Each vocabulary word's length, from the dictionary's int64 offsets."""
        if self._vocab_lengths is None:
            offsets = np.frombuffer(self.vocab.buffers()[1], dtype=np.int64)
            self._vocab_lengths = np.diff(offsets[self.vocab.offset:self.vocab.offset + len(self.vocab) + 1])
        return self._vocab_lengths

    def view(self, lo: np.ndarray, hi: np.ndarray, keep: int = 0) -> ViewWords:
        """The words of each row's byte range [lo, hi) of the buffer; `keep` > 0 keeps each row's first `keep`
        words, < 0 its last `-keep`, 0 all of them."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        first_run = np.searchsorted(self.ends, lo, side="right")  # the first word ending after lo
        end_run = np.searchsorted(self.starts, hi, side="left")  # past the last word starting before hi
        counts = np.where(hi > lo, np.maximum(end_run - first_run, 0), 0)
        if keep:
            counts = np.minimum(counts, abs(keep))
            if keep < 0:
                first_run = end_run - counts
        row_first = np.cumsum(counts) - counts
        shift = first_run - row_first  # run index minus word index, per row
        total = int(counts.sum())
        busy = np.flatnonzero(counts)
        if total == 0:
            ids = np.zeros(0, dtype=np.int32)
        elif (shift[busy] == shift[busy[0]]).all():  # one stretch of runs (the whole text): no gather
            ids = self.ids[shift[busy[0]]:shift[busy[0]] + total].copy()
        else:
            ids = self.ids[np.arange(total, dtype=np.int64) + np.repeat(shift, counts)]
        extras: dict[bytes, int] = {}
        first, last = first_run[busy], first_run[busy] + counts[busy] - 1
        for rows, runs, at in ((busy, first, row_first[busy]), (busy, last, row_first[busy] + counts[busy] - 1)):
            start, end = np.maximum(self.starts[runs], lo[rows]), np.minimum(self.ends[runs], hi[rows])
            for k in np.flatnonzero((start != self.starts[runs]) | (end != self.ends[runs])).tolist():
                word = self.data[start[k]:end[k]].translate(_LOWER)  # a range boundary inside a word: rare
                ids[at[k]] = len(self.vocab) + extras.setdefault(word, len(extras))
        return ViewWords(self, ids, row_first, counts, list(extras))


class ViewWords:
    """One view's words: `ids` (vocabulary ids, then `extras` past it), row after row; row r's words are
    ids[row_first[r] : row_first[r] + counts[r]]."""

    def __init__(self, runs: Runs, ids: np.ndarray, row_first: np.ndarray, counts: np.ndarray,
                 extras: Sequence[bytes]):
        self.runs, self.ids, self.row_first, self.counts, self.extras = runs, ids, row_first, counts, extras
        self.n = len(counts)

    def table(self, word: bytes, mode: str) -> np.ndarray:
        found = self.runs.table(word, mode)
        if not self.extras:
            return found
        return np.concatenate([found, np.array([_matches(word, mode, x) for x in self.extras], dtype=bool)])

    def hits(self, cue_sets: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For each cue set, (n,) bool: the rows where some cue's words occur consecutively."""
        out = [np.zeros(self.n, dtype=bool) for _ in cue_sets]
        for group in range(0, len(cue_sets), SETS_PER_PASS):
            bits = np.zeros(len(self.runs.vocab) + len(self.extras), dtype=np.uint64)
            for k, cues in enumerate(cue_sets[group:group + SETS_PER_PASS]):
                for cue in cues:
                    terms = cue_terms(cue)
                    if len(terms) == 1:
                        bits[self.table(*terms[0])] |= np.uint64(1 << k)
                    else:
                        out[group + k][self._phrase_rows(terms)] = True
            if bits.any():
                row_bits = self._or_per_row(np.take(bits, self.ids))
                for k in range(min(SETS_PER_PASS, len(cue_sets) - group)):
                    out[group + k] |= (row_bits & np.uint64(1 << k)) != 0
        return out

    def _or_per_row(self, word_bits: np.ndarray) -> np.ndarray:
        row_bits = np.zeros(self.n, dtype=word_bits.dtype)
        busy = np.flatnonzero(self.counts)
        if len(busy):
            row_bits[busy] = np.bitwise_or.reduceat(word_bits, self.row_first[busy])
        return row_bits

    def _phrase_rows(self, terms: Sequence[tuple[bytes, str]]) -> np.ndarray:
        """The rows where words passing `terms` follow each other (a cue of several words)."""
        size = max(len(self.ids) - len(terms) + 1, 0)
        at = np.flatnonzero(np.take(self.table(*terms[0]), self.ids[:size]))
        row = np.searchsorted(self.row_first, at, side="right") - 1
        row_end = self.row_first[row] + self.counts[row]
        for k, term in enumerate(terms[1:], start=1):
            keep = (at + k < row_end)
            keep[keep] = np.take(self.table(*term), self.ids[at[keep] + k])
            at, row, row_end = at[keep], row[keep], row_end[keep]
        return row
