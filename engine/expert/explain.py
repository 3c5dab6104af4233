"""A gate verdict in plain words, for the expert: what the annotator does, how it compares with chance, and
which of the gate's checks decided, with the numbers the gate wrote in its reasons.

The gate's reasons are terse ("fires 3 < 5", "Jaccard 0.97 > 0.95"); this turns them into sentences a domain
expert reads without knowing the gate. It adds no judgement of its own beyond chance: the share of dev the
annotator's voted classes hold, the precision a rule that fires on rows regardless of their content gets.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.domain import FIRST_FAULT, REPLACED_BY, THIN_FITNESS_ROWS, AnnotatorScore
from engine.markdown import escape_md
from engine.metrics.score import lift

NUMBER = r"(-?\d+(?:\.\d+)?)"
AT_CHANCE_LIFT = 1.0  # at or below: the precision says nothing about the class
WEAK_LIFT = 1.5  # below: barely better than chance


@dataclass(frozen=True)
class Explanation:
    """Sentences for the expert, and whether the annotator's precision is no better than chance."""

    lines: tuple[str, ...]
    at_chance: bool
    chance: float
    lift: float

    def text(self) -> str:
        return " ".join(self.lines)


def _find(pattern: str, reasons: Sequence[str]) -> re.Match | None:
    for reason in reasons:
        found = re.search(pattern, reason)
        if found:
            return found
    return None


def _a(role: str) -> str:
    """"a generator", "an improver"."""
    return ("an " if role[:1] in "aeiou" else "a ") + role


def _named(text: str, names: Mapping[str, str]) -> str:
    return names.get(text, text[:8] if len(text) > 12 else text)


def what_it_does(score: AnnotatorScore, label: str, n_dev: int, chance: float) -> tuple[list[str], bool, float]:
    """Its fires and precision, then chance: (sentences, at chance?, lift)."""
    if not score.fires:
        return [f"It voted on none of the {n_dev} dev rows the gate judges on."], False, 0.0
    lines = [f"It votes (mostly) **{label}** on {score.fires} of {n_dev} dev rows and is right on {score.correct} "
             f"of them (precision {score.precision:.2f})."]
    times = lift(score.precision, chance)
    if chance <= 0:
        return lines, False, times
    if times <= AT_CHANCE_LIFT + 1e-9:
        lines.append(f"That is **no better than chance**: {chance:.0%} of dev is {label}, so a rule that fires on "
                     f"rows whatever they say (text length, say) is right as often. Its precision tells you "
                     "nothing about the class.")
        return lines, True, times
    if times < WEAK_LIFT:
        lines.append(f"That is only a little better than chance ({chance:.0%} of dev is {label}; "
                     f"{times:.1f}x).")
    else:
        lines.append(f"That is {times:.1f}x better than chance ({chance:.0%} of dev is {label}).")
    return lines, False, times


def why_the_verdict(verdict: str, reasons: Sequence[str], decided_by: str, names: Mapping[str, str],
                    note: str = "") -> list[str]:
    """Which check decided, in words, with the gate's own numbers (`note`: an expert verdict's own words)."""
    if decided_by == "human" and verdict == "reject" and note.startswith(REPLACED_BY):
        edit = note[len(REPLACED_BY):].strip()
        return [f"Retired when its edited version {_named(edit, names)} took its place (nobody rejected it); its "
                "**Restore this version** button swaps them back."]
    if decided_by == "human":
        return ["You (the expert) " + ("approved it: it stays in the pool whatever the gate says."
                                      if verdict == "approve" else "rejected it: the gate will not let it back.")]
    if verdict == "approve":
        return ["An expert approved it earlier, so the gate keeps it without checks."]
    if verdict == "prune":
        found = _find(r"covered by (\S+): " + NUMBER, reasons)
        who = _named(found.group(1), names) if found else "a newcomer"
        share = f" ({float(found.group(2)):.0%} of its rows)" if found else ""
        return [f"Pruned: {who} fires on the same rows{share} with clearly higher precision, so it replaces this "
                "one."]
    if verdict == "reject":
        if _find(r"rejected by a human", reasons):
            return ["An expert rejected it earlier; the gate does not re-admit it."]
        if found := _find(r"generation reverted: pool dev macro-F1 would fall " + NUMBER + " -> " + NUMBER, reasons):
            return [f"Rejected with its whole generation: together the newcomers would have lowered the pool's dev "
                    f"macro-F1 from {found.group(1)} to {found.group(2)}, so the gate undid the generation."]
        lines = []
        if found := _find(r"faults on " + NUMBER + " of " + NUMBER, reasons):
            lines.append(f"Rejected: its code fails on {found.group(1)} of {found.group(2)} dev rows.")
        if found := _find(r"fires " + NUMBER + " < " + NUMBER, reasons):
            rows = _find(r"its class has " + NUMBER + " dev rows", reasons)
            small = f" (its class has only {rows.group(1)} dev rows: label more of them to judge it better)" \
                if rows else ""
            lines.append(f"Rejected: it fires on only {found.group(1)} dev rows; the gate needs "
                         f"{found.group(2)}{small} to judge a precision.")
        if found := _find(r"no better than chance: precision lower bound " + NUMBER + " <= " + NUMBER, reasons):
            lines.append(f"Rejected: allowing for luck, its precision may be as low as {found.group(1)}, no better "
                         f"than chance ({found.group(2)}, the share of dev its classes hold).")
        elif _find(r"no better than chance", reasons):
            lines.append("Rejected: its precision is no better than chance.")
        if found := _find(r"lower bound " + NUMBER + r" over " + NUMBER + r" fires: \S+ < " + NUMBER
                          + r" \((\w+)\)", reasons):
            lines.append(f"Rejected: allowing for luck on {found.group(2)} fires, its precision may be as low as "
                         f"{found.group(1)}, under the {found.group(3)} {_a(found.group(4))} must reach.")
        elif found := _find(r"precision " + NUMBER + r" over " + NUMBER + r" dev fires and about " + NUMBER
                            + r" on the unlabeled sample \(worth " + NUMBER + r" rows\), lower bound " + NUMBER
                            + r": \S+ < " + NUMBER + r" \((\w+)\)", reasons):
            lines.append(f"Rejected: it is right on {found.group(1)} of its {found.group(2)} dev fires, and on the "
                         f"unlabeled sample a text classifier fitted on dev agrees with about {found.group(3)} of its "
                         f"votes (that sample worth {found.group(4)} rows); together its precision may be as low as "
                         f"{found.group(5)}, under the {found.group(6)} {_a(found.group(7))} must reach.")
        elif found := _find(r"^precision " + NUMBER + " < " + NUMBER + r" \((\w+)\)", reasons):
            lines.append(f"Rejected: precision {found.group(1)} is under the {found.group(2)} {_a(found.group(3))} "
                         "must reach.")
        if found := _find(r"too similar to (\S+): Jaccard " + NUMBER, reasons):
            lines.append(f"Rejected: it fires on nearly the same rows as {_named(found.group(1), names)} (overlap "
                         f"{float(found.group(2)):.0%}), so it adds nothing new.")
        if found := _find(r"removing it raises pool dev macro-F1 " + NUMBER + " -> " + NUMBER, reasons):
            lines.append(f"Rejected: the pool is better without it (dev macro-F1 {found.group(1)} with it, "
                         f"{found.group(2)} without).")
        if found := _find("^" + re.escape(FIRST_FAULT) + "(.+)", reasons):
            lines.append(f"Its code went wrong on dev, first: {escape_md(found.group(1))}.")
        return lines or ["Rejected: " + escape_md("; ".join(reasons))]
    if _find(r"already in the pool", reasons):
        return ["Kept: it was already in the pool."]
    parts = []
    if found := _find(r"diverse: max Jaccard " + NUMBER + r" <= \S+(?: \(vs (\S+)\))?", reasons):
        parts.append(f"it fires on rows the others miss (its largest overlap is {float(found.group(1)):.0%}"
                     + (f", with {_named(found.group(2), names)})" if found.group(2) else ")"))
    if found := _find(r"marginal: pool dev macro-F1 " + NUMBER + " without it, " + NUMBER + " with it", reasons):
        gain = float(found.group(2)) - float(found.group(1))
        parts.append(f"the pool's dev macro-F1 is {found.group(2)} with it and {found.group(1)} without "
                     f"({gain:+.3f})")
    # the bar it cleared, not "precise enough": at 0.35 no expert would call it that
    cleared = _find(r"^viable: .*?" + NUMBER + r" >= " + NUMBER + r" \((\w+)\)", reasons)
    luck = "allowing for luck, " if _find(r"^viable: .*lower bound", reasons) else ""
    bar = (f"Accepted: {luck}its precision is at least {cleared.group(1)}, over the {cleared.group(2)} "
           f"{_a(cleared.group(3))} must reach" if cleared else "Accepted: over the gate's precision bar")
    return [bar + ("; " + "; ".join(parts) if parts else "") + "."]


def too_few_rows(label: str, rows: int) -> str:
    """Why a class with few dev rows cannot judge an annotator, and what the expert can do."""
    return (f"Only {rows} dev row{'s' if rows != 1 else ''} the gate judges on {'are' if rows != 1 else 'is'} "
            f"{label}: one row more or less right moves a precision there by up to {1 / max(rows, 1):.0%}, so "
            f"the figure is mostly chance. Label more {label} rows (Labels screen: label rows for dev, or import "
            f"them), describe {label} in its own words (Project screen: the agents try them as cues), or read its "
            "fired rows and judge the cues yourself.")


def explain(verdict: str, reasons: Sequence[str], score: AnnotatorScore | None, label: str, n_dev: int,
            chance: float, decided_by: str = "gate", names: Mapping[str, str] | None = None,
            class_rows: int | None = None, note: str = "") -> Explanation:
    """The whole explanation of one verdict, in markdown (`chance`: see engine.metrics.score.chance_precision;
    `class_rows`: the fitness rows of its class, said when too few to judge it). `label` and `names` are shown as
    given: escape them first (engine.markdown.escape_md), as review.explain_verdicts does."""
    lines: list[str] = []
    at_chance, times = False, 0.0
    if score is not None:
        lines, at_chance, times = what_it_does(score, label, n_dev, chance)
        if label and class_rows is not None and class_rows < THIN_FITNESS_ROWS:
            lines.append(too_few_rows(label, class_rows))
    lines += why_the_verdict(verdict, reasons, decided_by, names or {}, note)
    return Explanation(tuple(lines), at_chance, chance, times)
