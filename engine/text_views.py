"""Views: the parts of an example an annotator (or a text feature) reads, reduced to lower-case words.

The whole sentence, its first words (the "lead": a question word and its head noun), and for relation
tasks (two entity spans) the words between the mentions, a few words before and after them, and each
entity's name. The offline agents mine cues per view (engine/agents/mining.py), the emitted annotator code
computes the same views (engine/agents/templates.py), and the relation text feature reads the "between" view.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

WORD = re.compile(r"[a-z0-9]+")
WINDOW = 3  # words kept on each side of an entity pair ("before" / "after" views)
LEAD = 4  # words kept at the start of the text ("lead" view: question words and their head noun)
RELATION_VIEWS = ("between", "sentence", "before", "after", "entity1", "entity2")
TEXT_VIEWS = ("sentence", "lead")


def normalise(text: object) -> str:
    """Lower-case words joined by single spaces (what every cue regex is matched against)."""
    return " ".join(WORD.findall(str(text or "").lower()))


def _ordered_spans(example: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The two entity spans sorted by start; raises like the emitted code does when they are unusable."""
    first, second = sorted([tuple(example["span1"]), tuple(example["span2"])])
    return first, second


def view_text(example: dict[str, Any], view: str) -> str:
    """The normalised words of one view of an example ('' where the view does not exist)."""
    text = str(example.get("text") or "")
    if view == "sentence":
        return normalise(text)
    if view == "lead":
        return " ".join(normalise(text).split()[:LEAD])
    if view in ("entity1", "entity2"):
        return normalise(example.get(view))
    try:  # unpacking exactly as the emitted helpers do, so malformed spans fail (or not) alike
        if view == "between":
            (_, first_end), (second_start, _) = _ordered_spans(example)
            return normalise(text[first_end:second_start])
        if view == "before":
            (first_start, _), _ = _ordered_spans(example)
            return " ".join(normalise(text[:first_start]).split()[-WINDOW:])
        if view == "after":
            _, (_, second_end) = _ordered_spans(example)
            return " ".join(normalise(text[second_end:]).split()[:WINDOW])
    except (KeyError, TypeError, ValueError):
        return ""
    raise ValueError(f"unknown view {view!r}")


def task_views(fields: Sequence[str]) -> tuple[str, ...]:
    """Relation tasks (two entity spans) get entity-context views; others get sentence and lead."""
    return RELATION_VIEWS if {"span1", "span2"} <= set(fields) else TEXT_VIEWS
