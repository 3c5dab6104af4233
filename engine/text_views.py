"""Views: the parts of an example an annotator (or a text feature) reads, reduced to lower-case words.

The whole sentence, its first words (the "lead": a question word and its head noun), and for relation
tasks (two entity spans) the words between the mentions (all of them, or only when they are few: "near"), a
few words before and after them, and each entity's name. The offline agents mine cues per view
(engine/agents/offline/cues.py), the emitted annotator code computes the same views (engine/specs/templates.py),
and the relation text feature reads the words between and around the mentions, marked by place
(`relation_context`).
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

WORD = re.compile(r"[a-z0-9]+")
WINDOW = 3  # words kept on each side of an entity pair ("before" / "after" views)
LEAD = 4  # words kept at the start of the text ("lead" view: question words and their head noun)
# The "near" view: the words between the mentions when there are at most NEAR of them. A trigger word close to
# both arguments names their relation far more often than one anywhere between them: on the whole ChemProt
# valid split, inhibit* between the mentions is Downregulator on 81 % of 298 rows, with at most 5 words between
# on 95 % of 87; agonist* 60 % of 35 against 94 % of 18, antagon* 68 % of 66 against 93 % of 30
# (bench/cue_precision.py).
NEAR = 5
# ...but where the mentions are rarely further apart (more than NEAR words between them on 10 % of SemEval's valid
# rows that have words between them, against 65 % on ChemProt), "near" is a copy of "between", and the offline
# agents do not mine it: its annotators would only crowd the pool with near copies.
NEAR_MIN_SHARE = 0.25
RELATION_VIEWS = ("between", "near", "sentence", "before", "after", "entity1", "entity2")
TEXT_VIEWS = ("sentence", "lead")


def normalise(text: object) -> str:
    """Lower-case words joined by single spaces (what every cue regex is matched against)."""
    return " ".join(WORD.findall(str(text or "").lower()))


SPAN_VIEWS = ("between", "before", "after")


def span_pieces(example: dict[str, Any]) -> tuple[str, str, str]:
    """The raw text between, before and after the two entity mentions (`raw_piece` of the SPAN_VIEWS at once).
    The spans are unpacked exactly as each emitted helper unpacks them, so malformed ones fail (to '') alike:
    "before" reads only the first span's start, "after" only the second's end, "between" both."""
    try:
        first, second = sorted([tuple(example["span1"]), tuple(example["span2"])])
        text = str(example.get("text") or "")
    except (KeyError, TypeError, ValueError):
        return "", "", ""
    try:
        (_, first_end), (second_start, _) = first, second
        between = text[first_end:second_start]
    except (TypeError, ValueError):
        between = ""
    try:
        first_start, _ = first
        before = text[:first_start]
    except (TypeError, ValueError):
        before = ""
    try:
        _, second_end = second
        after = text[second_end:]
    except (TypeError, ValueError):
        after = ""
    return between, before, after


# The relation feature's text (`relation_context`): each word marked by where it stands, so "inhibits" between the
# mentions is another column than "inhibits" just before them, and a near trigger also by which argument comes first.
CONTEXT_PARTS = (("between", "b"), ("before", "l"), ("after", "r"), ("near", "n"))


def mention_order(example: dict[str, Any]) -> str | None:
    """"xy" when the first argument (span1) is mentioned first, "yx" when the second is (spans compared as (start,
    end), as `masked_views` orders them); None where a view could not cut the text by them: no text, or spans that
    are not two slice positions each (the emitted annotators' views then give '' too)."""
    try:
        first, second = tuple(example["span1"]), tuple(example["span2"])
        text = str(example.get("text") or "")
        (first_start, first_end), (second_start, second_end) = first, second
        text[first_start:first_end], text[second_start:second_end]  # raises where a view could not slice
        order = "xy" if first <= second else "yx"
    except (KeyError, TypeError, ValueError):
        return None
    return order if text and None not in first + second else None


def relation_context(example: dict[str, Any]) -> str:
    """The text the relation TF-IDF reads: the mention order, then the words between the mentions, the WINDOW words
    before and after them and the near words, each prefixed by its place (b_, l_, r_, n_), the near words once more
    under the order. `auto` on pool rows' withheld gold labels, read with this text against the bare words between
    the mentions: ChemProt 0.541 -> 0.553, SemEval 0.619 -> 0.634, means over three seeds
    (bench/results/relation_view.md).
    '' where the spans are malformed (`mention_order`)."""
    order = mention_order(example)
    if order is None:
        return ""
    between, before, after = span_pieces(example)
    words = {"between": normalise(between), "before": window("before", normalise(before)),
             "after": window("after", normalise(after))}
    words["near"] = window("near", words["between"])
    tokens = [f"order_{order}"]
    for view, mark in CONTEXT_PARTS:
        tokens += [f"{mark}_{w}" for w in words[view].split()]
    tokens += [f"{order}_n_{w}" for w in words["near"].split()]
    return " ".join(tokens)


MASKS = ("X", "Y")  # what the first and second argument (span1, span2) become in the masked views


def masked_views(example: dict[str, Any]) -> tuple[str, str]:
    """The sentence with the two entity mentions replaced by X (span1) and Y (span2), and its part from the first
    mention to the second: what a sentence embedding of a relation should read. Names of chemicals and genes
    carry little of the relation and dominate a whole-sentence vector; on ChemProt dev (5-fold LR, seed 0) the
    two masked views together scored 0.41 macro-F1 against 0.33 for the whole sentence, on SemEval 0.56 against
    0.37. Malformed spans give the raw text twice."""
    text = str(example.get("text") or "")
    try:
        spans = [tuple(int(i) for i in example["span1"]), tuple(int(i) for i in example["span2"])]
        (a0, a1), (b0, b1) = sorted(spans)
        if not 0 <= a0 <= a1 <= b0 <= b1 <= len(text):
            return text, text
    except (KeyError, TypeError, ValueError):
        return text, text
    first, second = MASKS if spans[0] <= spans[1] else MASKS[::-1]
    middle = f"{first}{text[a1:b0]}{second}"
    return f"{text[:a0]}{middle}{text[b1:]}", middle


def raw_piece(example: dict[str, Any], view: str) -> str:
    """The raw text a view keeps words of ('' where the view does not exist): `view_text` normalises it and
    keeps its `window`."""
    if view in ("sentence", "lead"):
        return str(example.get("text") or "")
    if view in ("entity1", "entity2"):
        return str(example.get(view) or "")
    if view in SPAN_VIEWS:
        return span_pieces(example)[SPAN_VIEWS.index(view)]
    if view == "near":  # the between piece; `window` empties it past NEAR words
        return raw_piece(example, "between")
    raise ValueError(f"unknown view {view!r}")


def window(view: str, normalised: str) -> str:
    """The words of a normalised piece the view keeps: the first LEAD ("lead"), the last or first WINDOW
    ("before" / "after"), all or none ("near": none past NEAR words), all of them otherwise. Split with a
    bound, so long pieces cost little."""
    if view == "near":
        return normalised if len(normalised.split(" ", NEAR + 1)) <= NEAR else ""
    if view == "lead":
        return " ".join(normalised.split(" ", LEAD)[:LEAD])
    if view == "before":
        return " ".join(normalised.rsplit(" ", WINDOW)[-WINDOW:])
    if view == "after":
        return " ".join(normalised.split(" ", WINDOW)[:WINDOW])
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
    # surrogatepass: a lone surrogate (JSON may carry one) becomes non-ASCII bytes, a separator as in `normalise`
    if any(ch in joined for ch in LOWER_TO_ASCII):
        data = joined.lower().encode("utf-8", "surrogatepass")  # the rare exact path: lower() where it yields ASCII
    else:
        data = joined.encode("utf-8", "surrogatepass").lower()  # other non-ASCII lowers to non-ASCII: a separator
    data = b" " + data.translate(_KEEP_WORD_BYTES).replace(ROW_SEPARATOR, b" \x00 ") + b" "
    codes = np.frombuffer(data, dtype=np.uint8)
    space = codes == 0x20
    keep = np.ones(len(codes), dtype=bool)
    keep[1:] = ~(space[1:] & space[:-1])  # runs of spaces become one
    return codes[keep].tobytes()


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


def near_differs(examples: Sequence[dict[str, Any]]) -> bool:
    """Whether "near" is more than a copy of "between" on these rows: more than NEAR words separate the
    mentions on at least NEAR_MIN_SHARE of the rows that have words between them."""
    counts = [len(words.split()) for words in (view_text(ex, "between") for ex in examples) if words]
    return bool(counts) and sum(c > NEAR for c in counts) >= NEAR_MIN_SHARE * len(counts)


def mined_views(fields: Sequence[str], examples: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The views the offline agents mine cues in: the task's views, without "near" where it copies "between"."""
    views = task_views(fields)
    return views if "near" not in views or near_differs(examples) else tuple(v for v in views if v != "near")
