"""Compiled annotators: a pool member whose source is an unedited offline template is data, not code.

`compile_annotator(source)` reads the spec back (templates.parse_spec) and accepts it only when rendering that
spec gives the very same source (as emitted, or as `make_annotator` normalised it), the sandbox's checker
passes it, and every cue is of the form the miners write (lower-case words and digits, single spaces, a
leading and/or trailing `*`). Only then is a regex built here, in the app process, from the validated cues
(never from the source's text), so a crafted source cannot bring its own pattern: anything else is None and
runs in the sandbox. `scan` then applies many compiled annotators at once: each view is cut once per row for
the whole pool, and each annotator is one regex search over all rows joined. Votes equal the sandbox's exactly
(tests/test_compiled.py runs both paths on generated specs and on real pools).
"""
from __future__ import annotations

import ast
import bisect
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from engine.agents import offline_surface as surface
from engine.agents.templates import AnnotatorSpec, parse_spec, render
from engine.domain import ABSTAIN
from engine.sandbox.checks import MAX_SOURCE_CHARS, CodeRejected, check_source
from engine.sandbox.executor import jsonable
from engine.text_views import LEAD, normalise, view_text

CUE_FORM = re.compile(r"\*?[a-z0-9]+(?: [a-z0-9]+)*\*?")  # what the miners emit; nothing else is compiled
MAX_CUES = 512  # per tuple; the miners keep a handful
MAX_CUE_CHARS = 80
SEPARATOR = "\n"  # between rows of a joined view: no cue (and no \w) matches it, and \b sees it as an edge


@dataclass(frozen=True)
class CompiledAnnotator:
    """A validated template spec with its regexes (cue kind) built from the checked cues."""

    spec: AnnotatorSpec
    cue: re.Pattern[str] | None = None
    also: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None


def _pattern(cues: tuple[str, ...]) -> re.Pattern[str]:
    """The template's own construction (templates._pattern_line), applied to validated cues only."""
    return re.compile(r"\b(?:" + "|".join(cue.replace("*", r"\w*") for cue in cues) + r")\b")


def _safe_cues(cues: tuple[str, ...]) -> bool:
    return len(cues) <= MAX_CUES and all(len(c) <= MAX_CUE_CHARS and CUE_FORM.fullmatch(c) for c in cues)


def _safe_spec(spec: AnnotatorSpec) -> bool:
    if spec.kind == "surface":
        return (spec.feature in surface.MEASURES and spec.op in (">=", "<=")
                and math.isfinite(spec.threshold))
    return spec.kind == "cue" and all(_safe_cues(c) for c in (spec.cues, spec.also, spec.unless))


@lru_cache(maxsize=4096)
def compile_annotator(source: str) -> CompiledAnnotator | None:
    """The compiled form of an unedited template annotator, or None (it then runs in the sandbox)."""
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        return None
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
    if spec.kind == "surface":
        return CompiledAnnotator(spec)
    return CompiledAnnotator(spec, _pattern(spec.cues), _pattern(spec.also) if spec.also else None,
                             _pattern(spec.unless) if spec.unless else None)


def compiles(source: str) -> bool:
    """Whether this annotator source runs on the compiled path (else the sandbox runs it)."""
    return compile_annotator(source) is not None


# ---- the scan ------------------------------------------------------------------------------------------
_PLAIN = (str, int, float, bool, type(None))


def _as_sent(value: Any) -> Any:
    """A field value as the sandbox worker sees it (the executor ships examples as JSON)."""
    if type(value) in _PLAIN:
        return value
    if type(value) in (list, tuple) and all(type(v) is int for v in value):
        return value  # spans: tuple() of either is the same
    return json.loads(json.dumps(value, default=jsonable))


class Views:
    """Each view's normalised text for every row, cut once for the whole pool, joined for one regex pass."""

    FIELDS = ("text", "entity1", "entity2", "span1", "span2")

    def __init__(self, examples: Sequence[dict]):
        self.examples = examples
        self._sent: list[dict] | None = None
        self._rows: dict[str, list[str]] = {}
        self._joined: dict[str, tuple[str, list[int]]] = {}
        self._measures: dict[str, np.ndarray] = {}

    def sent(self) -> list[dict]:
        if self._sent is None:
            self._sent = [{k: _as_sent(ex[k]) for k in self.FIELDS if k in ex} for ex in self.examples]
        return self._sent

    def rows(self, view: str) -> list[str]:
        if view not in self._rows:
            if view == "sentence":
                out = [normalise(ex.get("text")) for ex in self.sent()]
            elif view == "lead":
                out = [" ".join(s.split()[:LEAD]) for s in self.rows("sentence")]
            else:
                out = [view_text(ex, view) for ex in self.sent()]
            self._rows[view] = out
        return self._rows[view]

    def joined(self, view: str) -> tuple[str, list[int]]:
        """The view's rows joined by SEPARATOR, and each row's start offset."""
        if view not in self._joined:
            rows, starts, at = self.rows(view), [], 0
            for row in rows:
                starts.append(at)
                at += len(row) + 1
            self._joined[view] = (SEPARATOR.join(rows), starts)
        return self._joined[view]

    def measure(self, feature: str) -> np.ndarray:
        if feature not in self._measures:
            fn = surface.MEASURES[feature]
            self._measures[feature] = np.array([fn(str(ex.get("text") or "")) for ex in self.sent()],
                                               dtype=np.float64)
        return self._measures[feature]


def _matching_rows(pattern: re.Pattern[str], joined: str, starts: list[int]) -> np.ndarray:
    """Indices of rows where `pattern` matches: one search per matching row, the rest scanned in C."""
    hits, pos, search, n = [], 0, pattern.search, len(starts)
    while True:
        match = search(joined, pos)
        if match is None:
            break
        row = bisect.bisect_right(starts, match.start()) - 1
        hits.append(row)
        if row + 1 >= n:
            break
        pos = starts[row + 1]
    return np.asarray(hits, dtype=np.int64)


def fired(compiled: CompiledAnnotator, views: Views) -> np.ndarray:
    """(n,) bool: the rows where the annotator returns its label."""
    spec, n = compiled.spec, len(views.examples)
    if spec.kind == "surface":
        values = views.measure(spec.feature)
        return values >= spec.threshold if spec.op == ">=" else values <= spec.threshold
    assert compiled.cue is not None
    mask = np.zeros(n, dtype=bool)
    mask[_matching_rows(compiled.cue, *views.joined(spec.view))] = True
    for pattern, wanted in ((compiled.also, True), (compiled.unless, False)):
        if pattern is None or not mask.any():
            continue
        candidates = np.flatnonzero(mask)
        if len(candidates) * 8 < n:  # few rows left: test them one by one
            sentence = views.rows("sentence")
            keep = np.fromiter((bool(pattern.search(sentence[i])) == wanted for i in candidates), bool,
                               len(candidates))
            mask[candidates[~keep]] = False
        else:
            found = np.zeros(n, dtype=bool)
            found[_matching_rows(pattern, *views.joined("sentence"))] = True
            mask &= found if wanted else ~found
    return mask


@dataclass(frozen=True)
class ScanResult:
    """One compiled annotator's votes, with faults counted as the sandbox counts them."""

    votes: np.ndarray
    faults: int
    first_error: str | None
    seconds: float


def scan(pool: Sequence[CompiledAnnotator], examples: Sequence[dict], labels: Sequence[str],
         views: Views | None = None) -> list[ScanResult]:
    """Votes of every compiled annotator on every example; a label outside `labels` is a fault per firing
    row, worded as the sandbox words it."""
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
                           f"(example {int(np.argmax(mask))})")
        out.append(ScanResult(votes, faults, first_error, time.perf_counter() - started))
    return out
