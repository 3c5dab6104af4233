"""Compiled annotators: a pool member whose source is an unedited offline template is data, not code.

`compile_annotator(source)` reads the spec back (templates.parse_spec) and accepts it only when rendering that
spec gives the very same source (as emitted, or as `make_annotator` normalised it), the sandbox's checker
passes it, and every cue has the form the miners write (lower-case ASCII words and digits, single spaces, an
optional `*` at either end; bounded count and length). Anything else is None and runs in the sandbox. No
regex is taken from the source: a validated cue becomes a literal byte string (`needle`), so a crafted source
can bring no pattern (ReDoS) or code into this process.

`scan` applies many compiled annotators at once: the words of each view of every row are found once for the
whole pool and numbered (engine.apply.word_index; texts become one byte per character, a view is a byte range
per row), so an annotator's cues cost one test per cue word on the vocabulary and a gather over the word ids,
whatever the number of rows; a cue set shared by several annotators is looked up once. Only literal words are
compared, so a crafted cue has no pattern to bring.
Votes, faults and error texts equal the sandbox's (tests/test_compiled.py checks both paths on generated
specs, awkward rows and the ChemProt pool).
"""
from __future__ import annotations

import ast
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np

from engine.apply.word_index import Runs, ViewWords
from engine.domain import ABSTAIN
from engine.sandbox.checks import MAX_SOURCE_CHARS, LabelIndex, check_source
from engine.sandbox.executor import jsonable
from engine.specs import surface
from engine.specs.templates import AnnotatorSpec, parse_spec, render
from engine.text_views import LEAD, LOWER_TO_ASCII, NEAR, SPAN_VIEWS, WINDOW, normalise_all, span_pieces, window

CUE_FORM = re.compile(r"\*?[a-z0-9]+(?: [a-z0-9]+)*\*?")  # what the miners emit; nothing else is compiled
MAX_CUES = 512  # per tuple; the miners keep a handful
MAX_CUE_CHARS = 80
# words over all of a spec's cues, `also` and `unless`: the scan costs a test per cue word and runs in the app
# process with no CPU budget, so 3 x 380 cues of 40 words held it for 18 s a 65,536-row chunk (a red-team review);
# the offline agents' largest specs hold a few dozen words. A larger one runs in the sandbox, under its budget
MAX_SPEC_WORDS = 1000
WINDOWED = ("lead", "before", "after", "near")  # views that keep some of their words, or none (text_views.window)


@dataclass(frozen=True)
class CompiledAnnotator:
    """A template spec whose cues passed the checks; `fired` runs it over a `Views`."""

    spec: AnnotatorSpec


def _safe_cues(cues: tuple[str, ...]) -> bool:
    return len(cues) <= MAX_CUES and all(len(c) <= MAX_CUE_CHARS and CUE_FORM.fullmatch(c) for c in cues)


def _safe_spec(spec: AnnotatorSpec) -> bool:
    if spec.kind == "surface":
        return (spec.feature in surface.MEASURES and spec.op in (">=", "<=")
                and math.isfinite(spec.threshold))
    tuples = (spec.cues, spec.also, spec.unless)
    return (spec.kind == "cue" and bool(spec.cues) and all(_safe_cues(c) for c in tuples)
            and sum(len(cue.split()) for cues in tuples for cue in cues) <= MAX_SPEC_WORDS)


def compile_annotator(source: str) -> CompiledAnnotator | None:
    """The compiled form of an unedited template annotator, or None (it then runs in the sandbox)."""
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        return None
    return _compile(source)


@lru_cache(maxsize=1024)  # a pool is compiled on every run; templates are a few KB each
def _compile(source: str) -> CompiledAnnotator | None:
    try:
        spec = parse_spec(source)
        if spec is None or not _safe_spec(spec):
            return None
        rendered = render(spec)
        if source not in (rendered, ast.unparse(ast.parse(rendered)) + "\n"):
            return None
        check_source(source)  # what the sandbox would refuse must stay refused
    except Exception:  # noqa: BLE001 - untrusted source: whatever it makes the parse raise, the sandbox runs it
        return None
    return CompiledAnnotator(spec)


def compiles(source: str) -> bool:
    """Whether this annotator source runs on the compiled path (else the sandbox runs it)."""
    return compile_annotator(source) is not None


# ---- the scan ------------------------------------------------------------------------------------------
_PLAIN = frozenset({str, int, float, bool, type(None)})
FIELDS = ("text", "entity1", "entity2", "span1", "span2")  # what the views read


def _as_sent(value: Any) -> Any:
    """A field value as the sandbox worker sees it (the executor ships examples as JSON)."""
    return value if type(value) in _PLAIN else json.loads(json.dumps(value, default=jsonable))


def _sent_example(example: dict) -> dict:
    """The example itself when the fields the views read survive JSON unchanged (the usual case: strings and
    int spans), else those fields as the worker would see them."""
    for key in FIELDS:
        value: Any = example.get(key)
        kind = type(value)
        if kind in _PLAIN or ((kind is list or kind is tuple) and len(value) == 2
                              and type(value[0]) is int and type(value[1]) is int):
            continue
        return {k: _as_sent(example[k]) for k in FIELDS if k in example}
    return example


def needle(cue: str) -> bytes:
    """The bytes whose presence in a padded normalised row (b" w1 w2 ... ") is exactly a match of the
    template's `\\b<cue>\\b` (a `*` as `\\w*`): the view holds only words split by single spaces, so a cue
    without a leading `*` starts a word (a space before it) and one without a trailing `*` ends one."""
    core = cue.strip("*").encode("ascii")
    return (b"" if cue.startswith("*") else b" ") + core + (b"" if cue.endswith("*") else b" ")


class Views:
    """The words of each view of every row, found once for the whole pool (engine.apply.word_index), and which
    rows hold a set of cues, kept for other annotators with that set.

    Rows whose fields the sandbox sees unchanged take the vectorised path: texts that are strings (no character
    whose lower case is ASCII, LOWER_TO_ASCII), spans that are pairs of ints, entities that are plain values;
    their characters become one byte each (ASCII lower-cased, anything else a separator) and a view is a byte
    range of that buffer per row. Any other chunk computes the view's strings row by row (text_views), exactly
    as before, and indexes their words."""

    def __init__(self, examples: Sequence[dict]):
        self.examples = examples
        self.n = len(examples)
        self._sent: list[dict] | None = None
        self._pieces: dict[str, list[str]] = {}
        self._rows: dict[str, list[str]] = {}
        self._words: dict[str, ViewWords] = {}
        self._texts: tuple[Runs, np.ndarray, np.ndarray] | None | bool = False  # False: not looked at yet
        self._spans: dict[str, tuple[np.ndarray, np.ndarray]] | None | bool = False
        self._hits: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
        self._measures: dict[str, np.ndarray] = {}
        self.fast_views: set[str] = set()  # the views that took the vectorised path (the tests check it)

    def sent(self) -> list[dict]:
        if self._sent is None:
            self._sent = [_sent_example(ex) for ex in self.examples]
        return self._sent

    def pieces(self, view: str) -> list[str]:
        """The raw text each row's view is cut from (text_views.raw_piece); the span views in one pass."""
        if view == "near":
            return self.pieces("between")
        if view not in self._pieces:
            sent = self.sent()
            if view in SPAN_VIEWS:
                cut = [span_pieces(ex) for ex in sent]
                for i, name in enumerate(SPAN_VIEWS):
                    self._pieces[name] = [row[i] for row in cut]
            else:
                field = "text" if view in ("sentence", "lead") else view
                self._pieces[view] = [str(ex.get(field) or "") for ex in sent]
        return self._pieces[view]

    def rows(self, view: str) -> list[str]:
        """The view's normalised rows (text_views.view_text of every row), computed row by row."""
        if view not in self._rows:
            if view == "lead":
                rows = self.rows("sentence")
            elif view == "near":
                rows = self.rows("between")
            else:
                rows = normalise_all(self.pieces(view))
            self._rows[view] = [window(view, row) for row in rows] if view in WINDOWED else rows
        return self._rows[view]

    def words(self, view: str) -> ViewWords:
        if view not in self._words:
            found = self._fast_words(view)
            if found is None:
                rows = self.rows(view)
                lo, hi = _row_ranges([len(r) for r in rows])
                found = Runs("\x00".join(rows).encode("ascii")).view(lo, hi)
            else:
                self.fast_views.add(view)
            self._words[view] = found
        return self._words[view]

    def _fast_words(self, view: str) -> ViewWords | None:
        if view in ("entity1", "entity2"):
            values = [ex.get(view) for ex in self.examples]
            if not set(map(type, values)) <= _PLAIN:
                return None
            fields = _char_runs([str(v or "") for v in values])
            return None if fields is None else fields[0].view(fields[1], fields[2])
        texts = self._text_runs()
        if texts is None:
            return None
        runs, lo, hi = texts
        if view in ("sentence", "lead"):
            return runs.view(lo, hi, LEAD if view == "lead" else 0)
        spans = self._span_ranges()
        if spans is None:
            return None
        if view == "near":  # the between range, emptied where it holds more than NEAR words
            lo, hi = spans["between"]
            return runs.view(lo, np.where(self.words("between").counts > NEAR, lo, hi))
        keep = {"between": 0, "before": -WINDOW, "after": WINDOW}[view]
        return runs.view(*spans[view], keep)

    def _text_runs(self) -> tuple[Runs, np.ndarray, np.ndarray] | None:
        if self._texts is False:
            texts: list[Any] = [ex.get("text") for ex in self.examples]
            self._texts = _char_runs(texts) if set(map(type, texts)) <= {str} else None
        return self._texts  # type: ignore[return-value]

    def _span_ranges(self) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """Each span view's [lo, hi) in the text buffer, by Python's slice rules, when every row's spans are int
        pairs (else None: text_views.span_pieces row by row)."""
        if self._spans is False:
            self._spans = None
            first, second = (_int_pairs([ex.get(k) for ex in self.examples]) for k in ("span1", "span2"))
            texts = self._text_runs()
            if first is not None and second is not None and texts is not None:
                _, row_start, row_end = texts
                length = row_end - row_start
                swap = (second[:, 0] < first[:, 0]) | ((second[:, 0] == first[:, 0]) & (second[:, 1] < first[:, 1]))
                first, second = np.where(swap[:, None], second, first), np.where(swap[:, None], first, second)
                first_start, first_end = (_slice_bound(first[:, i], length) for i in (0, 1))
                second_start, second_end = (_slice_bound(second[:, i], length) for i in (0, 1))
                zero = np.zeros_like(length)
                self._spans = {name: (row_start + a, row_start + np.maximum(a, b)) for name, (a, b) in {
                    "between": (first_end, second_start), "before": (zero, first_start),
                    "after": (second_end, length)}.items()}
        return self._spans  # type: ignore[return-value]

    def prepare(self, keys: Sequence[tuple[str, tuple[str, ...]]]) -> None:
        """Find the rows of many (view, cues) sets at once: one gather per view for up to 64 sets."""
        todo: dict[str, list[tuple[str, ...]]] = {}
        for view, cues in keys:
            key = (view, tuple(sorted(set(cues))))
            if key not in self._hits and key[1] not in todo.setdefault(view, []):
                todo[view].append(key[1])
        for view, sets in todo.items():
            if self.n and sets:
                for cues, found in zip(sets, self.words(view).hits(sets), strict=True):
                    self._hits[(view, cues)] = found

    def any_of(self, view: str, cues: tuple[str, ...]) -> np.ndarray:
        """(n,) bool: the rows whose view holds any of the cues (word_index: exactly the rows whose padded view
        holds one of the cues' needles)."""
        key = (view, tuple(sorted(set(cues))))
        if self.n == 0:
            return np.zeros(0, dtype=bool)
        if key not in self._hits:
            self.prepare([key])
        return self._hits[key].copy()

    def measure(self, feature: str) -> np.ndarray:
        if feature not in self._measures:
            fn = surface.MEASURES[feature]
            self._measures[feature] = np.array([fn(str(ex.get("text") or "")) for ex in self.sent()],
                                               dtype=np.float64)
        return self._measures[feature]


def _row_ranges(lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) of each row in the rows joined by one separator byte."""
    size = np.asarray(lengths, dtype=np.int64)
    lo = np.cumsum(size + 1) - (size + 1)
    return lo, lo + size


def _char_runs(texts: Sequence[str]) -> tuple[Runs, np.ndarray, np.ndarray] | None:
    """The words of strings joined by NUL, one byte per character: ASCII lower-cased, every other character
    ("?" from the encoder) a separator, as `normalise` treats them; None when a text holds one of the characters
    whose lower case is ASCII (the row-by-row path handles those)."""
    joined = "\x00".join(texts)
    if any(ch in joined for ch in LOWER_TO_ASCII):
        return None
    lo, hi = _row_ranges(list(map(len, texts)))
    return Runs(joined.encode("ascii", "replace")), lo, hi


def _int_pairs(values: list[Any]) -> np.ndarray | None:
    """(n, 2) int64 when every value is a pair of ints (bools count as ints, as Python's slicing takes them),
    else None."""
    if set(map(type, values)) <= {list, tuple} and set(map(len, values)) <= {2}:
        flat = list(chain.from_iterable(values))  # the usual case, checked without numpy's type inference
        if set(map(type, flat)) <= {int, bool}:
            try:
                return np.array(flat, dtype=np.int64).reshape(len(values), 2)
            except OverflowError:
                return None
    try:
        pairs = np.array(values)
    except (ValueError, TypeError, OverflowError):
        return None
    if pairs.shape != (len(values), 2) or pairs.dtype.kind not in "ib":
        return None
    return pairs.astype(np.int64)


def _slice_bound(index: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Where Python's `text[index:]` starts: negative counts from the end, both clamped into [0, len]."""
    return np.clip(np.where(index < 0, index + length, index), 0, length)


def cue_sets(spec: AnnotatorSpec) -> list[tuple[str, tuple[str, ...]]]:
    """The (view, cues) sets `fired` looks up for a spec."""
    if spec.kind != "cue":
        return []
    return [(spec.view, spec.cues)] + [(view, cues) for view, cues in (("sentence", spec.also),
                                                                        (spec.unless_view, spec.unless)) if cues]


def fired(compiled: CompiledAnnotator, views: Views) -> np.ndarray:
    """(n,) bool: the rows where the annotator returns its label."""
    spec = compiled.spec
    if spec.kind == "surface":
        values = views.measure(spec.feature)
        return values >= spec.threshold if spec.op == ">=" else values <= spec.threshold
    mask = views.any_of(spec.view, spec.cues)
    if spec.also and mask.any():
        mask &= views.any_of("sentence", spec.also)
    if spec.unless and mask.any():
        mask &= ~views.any_of(spec.unless_view, spec.unless)
    return mask


@dataclass(frozen=True)
class ScanResult:
    """One compiled annotator's votes, with faults counted as the sandbox counts them."""

    votes: np.ndarray
    faults: int
    first_error: str | None
    seconds: float


def scan(pool: Sequence[CompiledAnnotator], examples: Sequence[dict], labels: Sequence[str],
         views: Views | None = None, offset: int = 0) -> list[ScanResult]:
    """Votes of every compiled annotator on every example; a label outside `labels` is a fault per firing
    row, worded as the sandbox words it (`offset`: the index of `examples[0]` in the whole run)."""
    views = views or Views(examples)
    views.prepare([key for compiled in pool for key in cue_sets(compiled.spec)])
    label_index = LabelIndex(labels)  # as the sandbox reads a vote
    out = []
    for compiled in pool:
        started = time.perf_counter()
        mask = fired(compiled, views)
        votes = np.full(len(examples), ABSTAIN, dtype=np.int64)
        index = label_index.of(compiled.spec.label)
        faults, first_error = 0, None
        if index is not None:
            votes[mask] = index
        elif mask.any():
            faults = int(mask.sum())
            first_error = (f"returned {repr(compiled.spec.label)[:60]}, not a label "
                           f"(example {offset + int(np.argmax(mask))})")
        out.append(ScanResult(votes, faults, first_error, time.perf_counter() - started))
    return out
