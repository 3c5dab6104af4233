"""Compiled annotators: a pool member whose source is an unedited offline template is data, not code.

`compile_annotator(source)` reads the spec back (templates.parse_spec) and accepts it only when rendering that
spec gives the very same source (as emitted, or as `make_annotator` normalised it), the sandbox's checker
passes it, and every cue has the form the miners write (lower-case ASCII words and digits, single spaces, an
optional `*` at either end; bounded count and length). Anything else is None and runs in the sandbox. No
regex is taken from the source: a validated cue becomes a literal byte string (`needle`), so a crafted source
can bring no pattern (ReDoS) or code into this process.

`scan` applies many compiled annotators at once: each view of every row is normalised once for the whole pool
into one ASCII block (text_views.normalised_block), which Arrow sees as an array of rows without a copy, and
an annotator's cues are matched in one pass of RE2 (linear time) over it as an alternation of those literals.
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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.agents import offline_surface as surface
from engine.agents.templates import AnnotatorSpec, parse_spec, render
from engine.domain import ABSTAIN
from engine.sandbox.checks import MAX_SOURCE_CHARS, CodeRejected, check_source
from engine.sandbox.executor import jsonable
from engine.text_views import SPAN_VIEWS, block_of, normalise, normalised_block, rows_of, span_pieces, window

CUE_FORM = re.compile(r"\*?[a-z0-9]+(?: [a-z0-9]+)*\*?")  # what the miners emit; nothing else is compiled
MAX_CUES = 512  # per tuple; the miners keep a handful
MAX_CUE_CHARS = 80
WINDOWED = ("lead", "before", "after")  # views that keep some of their words (text_views.window)


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
    return spec.kind == "cue" and bool(spec.cues) and all(_safe_cues(c) for c in (spec.cues, spec.also, spec.unless))


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
    except (CodeRejected, ValueError, TypeError, KeyError, SyntaxError, RecursionError, MemoryError):
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
        value = example.get(key)
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
    """Each view of every row, normalised once for the whole pool into a block (text_views.normalised_block),
    and which rows hold a set of cues (RE2 over the block's rows), kept for other annotators with that set."""

    def __init__(self, examples: Sequence[dict]):
        self.examples = examples
        self.n = len(examples)
        self._sent: list[dict] | None = None
        self._blocks: dict[str, tuple[bytes, np.ndarray]] = {}
        self._pieces: dict[str, list[str]] = {}
        self._rows: dict[str, list[str]] = {}
        self._arrow: dict[str, pa.Array] = {}
        self._hits: dict[tuple[str, tuple[bytes, ...]], np.ndarray] = {}
        self._measures: dict[str, np.ndarray] = {}

    def sent(self) -> list[dict]:
        if self._sent is None:
            self._sent = [_sent_example(ex) for ex in self.examples]
        return self._sent

    def pieces(self, view: str) -> list[str]:
        """The raw text each row's view is cut from (text_views.raw_piece); the span views in one pass."""
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
        """The view's normalised rows (text_views.view_text of every row)."""
        if view not in self._rows:
            if view == "lead":
                rows = self.rows("sentence")
            else:
                block = normalised_block(self.pieces(view))
                rows = [normalise(p) for p in self.pieces(view)] if block is None else rows_of(block)
            self._rows[view] = [window(view, row) for row in rows] if view in WINDOWED else rows
        return self._rows[view]

    def block(self, view: str) -> tuple[bytes, np.ndarray]:
        """The view's block (text_views.normalised_block) and the offsets of its row separators."""
        if view not in self._blocks:
            block = None
            if view not in WINDOWED and view not in self._rows:
                block = normalised_block(self.pieces(view))
            if block is None:
                block = block_of(self.rows(view))
            separators = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 0)
            self._blocks[view] = (block, separators)
        return self._blocks[view]

    def arrow_rows(self, view: str) -> pa.Array:
        """The view's block as an Arrow binary array of its rows, without copying (each row keeps its NUL)."""
        if view not in self._arrow:
            block, separators = self.block(view)
            offsets = np.empty(len(separators) + 2, dtype=np.int64)
            offsets[0], offsets[-1] = 0, len(block)
            offsets[1:-1] = separators + 1
            self._arrow[view] = pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1,
                                                      [None, pa.py_buffer(offsets), pa.py_buffer(block)])
        return self._arrow[view]

    def any_of(self, view: str, cues: tuple[str, ...]) -> np.ndarray:
        """(n,) bool: the rows whose view holds any of the cues' needles, in one RE2 pass (a pattern of
        literal alternatives over [a-z0-9 ] only: linear time, nothing for a source to inject)."""
        needles = tuple(sorted({needle(cue) for cue in cues}))
        key = (view, needles)
        if self.n == 0:
            return np.zeros(0, dtype=bool)
        if key not in self._hits:
            pattern = "|".join(n.decode("ascii") for n in needles)
            found = pc.match_substring_regex(self.arrow_rows(view), pattern=pattern)
            self._hits[key] = found.to_numpy(zero_copy_only=False)
        return self._hits[key].copy()

    def measure(self, feature: str) -> np.ndarray:
        if feature not in self._measures:
            fn = surface.MEASURES[feature]
            self._measures[feature] = np.array([fn(str(ex.get("text") or "")) for ex in self.sent()],
                                               dtype=np.float64)
        return self._measures[feature]


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
        mask &= ~views.any_of("sentence", spec.unless)
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
    label_index = {name: i for i, name in enumerate(str(label) for label in labels)}
    out = []
    for compiled in pool:
        started = time.perf_counter()
        mask = fired(compiled, views)
        votes = np.full(len(examples), ABSTAIN, dtype=np.int64)
        index = label_index.get(compiled.spec.label)
        faults, first_error = 0, None
        if index is not None:
            votes[mask] = index
        elif mask.any():
            faults = int(mask.sum())
            first_error = (f"returned {repr(compiled.spec.label)[:60]}, not a label "
                           f"(example {offset + int(np.argmax(mask))})")
        out.append(ScanResult(votes, faults, first_error, time.perf_counter() - started))
    return out
