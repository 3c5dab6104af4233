"""Cues from what the task says, not from the rows: the words of each label's name and description.

A class called `card_arrival` or `Antagonist` names its own best cue. Mining a few hundred dev rows can miss
such a word (it fires on too few rows to rank) or rank a dev-only fluke above it; a word taken from the label
was not chosen by looking at dev (a few fixed specs per class are tried), so its dev figures are hardly inflated
by that choice. Seeded candidates still face the preview of the gate and the gate itself on dev, like every other
candidate, but the preview reads them without the margins it keeps against a scan's luck (`Proposal.mined`):
ChemProt's "not" between the mentions is "NOT" on 68 % of 41 valid rows (bench/results/cue_precision.md) and on 3
of 8 fitness rows in seed 0, which the scan's bound (z 1.5) and its two halves both turned away. The improver also
offers the weak classes' seeds, at its lower floor.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Collection
from itertools import permutations

import numpy as np

from engine.agents.offline.candidates import OfflineWorkspace
from engine.agents.offline.cues import MIN_PREFIX, dedupe_prefixes, stems
from engine.agents.offline.selection import Proposal
from engine.agents.offline.word_sense import nearest_words
from engine.specs.templates import AnnotatorSpec

SEED_BOOST = 2.0  # rank seeded cues above mined ones of equal dev lift: their choice did not read dev
MAX_WORDS = 6  # content words kept per label (name first, then description)
NEIGHBOURS = 8  # words of like meaning added to a label word's bank (engine/agents/offline/word_sense.py)
# views where a label word's neighbours name a class: an entity's own name ("bottle", "suitcase" for a container)
BANK_VIEWS = ("entity1", "entity2")
STOPWORDS = frozenset(
    "a an and are as at be by can for from has have in into is it its my not of on or that the this to was "
    "were which with e1 e2 other none any after before your you how what why when where".split()
)
# a function word in a description, but content in a name: ChemProt's NOT, banking77's card_not_working (there as
# one word of a pair: `not` alone fits 11 of its classes)
NEGATIONS = frozenset({"not"})


def label_words(label: str, description: str = "") -> list[str]:
    """Content words of a label's name (split at `_`, `-`, `/`, spaces and camelCase), then of its description.
    A negation counts as content in the name only (ChemProt's `NOT`: "not" between the mentions names it)."""
    words: list[str] = []
    for text, kept in ((label, NEGATIONS), (description, frozenset())):
        spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
        for word in re.findall(r"[a-z0-9]+", spaced.lower()):
            stop = word in STOPWORDS and word not in kept
            if len(word) >= 3 and not stop and not word.isdigit() and word not in words:
                words.append(word)
    return words[:MAX_WORDS]


INFLECTIONS = ("ing", "es", "ed", "s", "e")  # endings that change a word's form, not its meaning
_ES_AFTER = ("s", "x", "z", "ch", "sh")  # -es is a plural's only after these (boxes); species, series keep it


def word_cue(word: str, widest: bool = True) -> str:
    """The widest safe cue for a word: its shortest stem prefix (`arriv*` for arrival), else the word itself. Not
    `widest` (a description's words, which are plainer and many): only an inflection comes off (`subscrib*`,
    `inhibit*`), since a derivation's stem can name the opposite (`activ*` of "activity" fires on "activates",
    which a description of an inhibition class had planted)."""
    if not widest:
        inflected = [word[: -len(end)] for end in INFLECTIONS
                     if word.endswith(end) and len(word) - len(end) >= MIN_PREFIX
                     and (end != "es" or word[:-2].endswith(_ES_AFTER))]
        return min(inflected, key=len) + "*" if inflected else (word + "*" if len(word) >= MIN_PREFIX else word)
    prefixes = sorted(stems(word), key=len)
    return prefixes[0] if prefixes and len(prefixes[0]) - 1 >= MIN_PREFIX else word


def seeded_specs(ws: OfflineWorkspace) -> list[tuple[int, AnnotatorSpec]]:
    """(class, spec) pairs: each label word alone in each view, each ordered pair of a class's words as a
    conjunction (the first in the view, the second anywhere in the text), which names like `card_arrival`
    need (`card` alone fits a dozen banking classes), and each label word with the words nearest it in meaning
    as one bank (`neighbour_banks`)."""
    words_of = [label_words(label, str(ws.task.label_descriptions.get(label, ""))) for label in ws.task.labels]
    banks = neighbour_banks(ws, words_of)
    out: list[tuple[int, AnnotatorSpec]] = []
    for label_id, (label, words) in enumerate(zip(ws.task.labels, words_of, strict=True)):
        named = set(label_words(label))  # the name's words take the widest stem; the description's, a narrower one
        cues = list(dict.fromkeys(word_cue(w, widest=w in named) for w in words))
        out += [(label_id, spec) for spec in banks[label_id]]
        for view in ws.views:
            if view not in ("sentence", "between", "near", "lead"):
                continue  # entity names and short windows say little about a class name's words
            out += [(label_id, AnnotatorSpec("cue", label, view, (cue,))) for cue in cues]
            out += [(label_id, AnnotatorSpec("cue", label, view, (first,), also=(second,)))
                    for first, second in permutations(cues, 2)]
    return out


def neighbour_banks(ws: OfflineWorkspace, words_of: list[list[str]]) -> list[list[AnnotatorSpec]]:
    """Per class, a spec per label word (`words_of[class]`) and view of BANK_VIEWS mined here: the word's cue and up
    to NEIGHBOURS words of that view (in the pool sample, else dev) nearest it in meaning, as one bank. Chosen
    without reading a label, like the word itself. No banks (and one warning) where the word table cannot be had:
    the other seeds do not need it."""
    index = ws.pool if ws.pool is not None and ws.pool.n_rows else ws.dev
    out: list[list[AnnotatorSpec]] = [[] for _ in words_of]
    try:
        for label, words, banks in zip(ws.task.labels, words_of, out, strict=True):
            for view in (v for v in BANK_VIEWS if v in ws.views):
                for word in words:
                    near = [w for w in nearest_words(index, view, word, NEIGHBOURS + 4) if w not in STOPWORDS]
                    cue = word_cue(word, widest=word in label_words(label))
                    bank = dedupe_prefixes(tuple(dict.fromkeys((cue, *near[:NEIGHBOURS]))))
                    if len(bank) > 1:
                        banks.append(AnnotatorSpec("cue", label, view, bank))
    except (OSError, ImportError, RuntimeError, ValueError) as err:
        warnings.warn(f"no banks of like meaning: the word table is not available ({err})", stacklevel=2)
        return [[] for _ in words_of]
    return out


def seeded_proposals(ws: OfflineWorkspace, min_precision: float, classes: Collection[int] | None = None
                     ) -> list[Proposal]:
    """Seeded specs (of `classes` only, when given) that fire on dev with at least `min_precision`, ranked by
    lift x sqrt(support), boosted."""
    out: list[Proposal] = []
    for label_id, spec in seeded_specs(ws):
        if classes is not None and label_id not in classes:
            continue
        fired = ws.fires(spec)
        n = int(fired.sum())
        if n == 0:
            continue
        correct = int(np.count_nonzero(fired & ws.hit(label_id)))
        precision = correct / n
        lift = precision - float(ws.class_prior[label_id])
        if precision < min_precision or lift <= 0:
            continue
        out.append(Proposal(spec, label_id, fired, prior=float(SEED_BOOST * lift * np.sqrt(correct)),
                            note="seeded from the label's name or description", mined=False))
    return out
