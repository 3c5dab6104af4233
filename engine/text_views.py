"""Views: the parts of an example an annotator (or a text feature) reads, reduced to lower-case words.

The whole sentence, its first words (the "lead": a question word and its head noun), and for relation
tasks (two entity spans) the words between the mentions, a few words before and after them, and each
entity's name. The offline agents mine cues per view (engine/agents/mining.py), the emitted annotator code
computes the same views (engine/agents/templates.py), and the relation text feature reads the "between" view.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

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


def raw_piece(example: dict[str, Any], view: str) -> str:
    """The raw text a view keeps words of ('' where the view does not exist): `view_text` normalises it and
    keeps its `window`. Spans are unpacked exactly as the emitted helpers do, so malformed ones fail alike."""
    if view in ("sentence", "lead"):
        return str(example.get("text") or "")
    if view in ("entity1", "entity2"):
        return str(example.get(view) or "")
    try:
        if view == "between":
            (_, first_end), (second_start, _) = _ordered_spans(example)
            return str(example.get("text") or "")[first_end:second_start]
        if view == "before":
            (first_start, _), _ = _ordered_spans(example)
            return str(example.get("text") or "")[:first_start]
        if view == "after":
            _, (_, second_end) = _ordered_spans(example)
            return str(example.get("text") or "")[second_end:]
    except (KeyError, TypeError, ValueError):
        return ""
    raise ValueError(f"unknown view {view!r}")


def window(view: str, normalised: str) -> str:
    """The words of a normalised piece the view keeps: the first LEAD ("lead"), the last or first WINDOW
    ("before" / "after"), all of them otherwise. Split with a bound, so long pieces cost little."""
    if view == "lead":
        return " ".join(normalised.split(" ", LEAD)[:LEAD]) if normalised else ""
    if view == "before":
        return " ".join(normalised.rsplit(" ", WINDOW)[-WINDOW:]) if normalised else ""
    if view == "after":
        return " ".join(normalised.split(" ", WINDOW)[:WINDOW]) if normalised else ""
    return normalised


def view_text(example: dict[str, Any], view: str) -> str:
    """The normalised words of one view of an example ('' where the view does not exist)."""
    return window(view, normalise(raw_piece(example, view)))


ROW_SEPARATOR = b"\x00"
_KEEP_WORD_BYTES = bytes(c if (0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 or c == 0) else 0x20 for c in range(256))
LOWER_TO_ASCII = "\u0130\u212a"  # the non-ASCII characters whose lower() holds ASCII letters (I-dot, Kelvin K)


def normalised_block(texts: Sequence[str]) -> bytes | None:
    """`normalise` of every text at once, as one ASCII block b" row0 \\0 row1 \\0 ... " (each row padded by
    single spaces, rows split by NUL), computed in C over the joined texts; None when a text holds a NUL."""
    joined = "\x00".join(texts)
    if joined.count("\x00") != max(len(texts) - 1, 0):
        return None
    if any(ch in joined for ch in LOWER_TO_ASCII):
        data = joined.lower().encode("utf-8")  # the rare exact path: lower() where it yields ASCII
    else:
        data = joined.encode("utf-8").lower()  # other non-ASCII lowers to non-ASCII: a separator either way
    data = b" " + data.translate(_KEEP_WORD_BYTES).replace(ROW_SEPARATOR, b" \x00 ") + b" "
    codes = np.frombuffer(data, dtype=np.uint8)
    space = codes == 0x20
    keep = np.ones(len(codes), dtype=bool)
    keep[1:] = ~(space[1:] & space[:-1])  # runs of spaces become one
    return codes[keep].tobytes()


def block_of(normalised_rows: Sequence[str]) -> bytes:
    """The block of rows that are normalised already (e.g. `window`s of normalised rows)."""
    return (" " + " \x00 ".join(normalised_rows) + " ").encode("ascii")


def rows_of(block: bytes) -> list[str]:
    """The normalised rows of a block."""
    return [row.strip(" ") for row in block.decode("ascii").split("\x00")]


def normalise_all(texts: Sequence[str]) -> list[str]:
    """`normalise` of every text (the same strings as one call per text, several times faster)."""
    if not texts:
        return []
    block = normalised_block(texts)
    return [normalise(t) for t in texts] if block is None else rows_of(block)


def task_views(fields: Sequence[str]) -> tuple[str, ...]:
    """Relation tasks (two entity spans) get entity-context views; others get sentence and lead."""
    return RELATION_VIEWS if {"span1", "span2"} <= set(fields) else TEXT_VIEWS
