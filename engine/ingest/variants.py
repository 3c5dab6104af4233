"""Labels that differ only in case, spacing or number format ('Inhibitor' / 'inhibitor', 'no relation' /
'no  relation', '1' / '1.0').

In a label set read from the data they would become separate classes without a word, each with part of the rows,
so the import names them (a problem of the whole file) instead of guessing which spelling is meant.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable

from engine.ingest.errors import RowProblem


def label_key(name: str) -> str:
    """What two spellings of one label share: the words, case-folded; a number, its value ('1' and '1.0': a
    spreadsheet that saved some cells as floats made them two classes)."""
    words = " ".join(name.split()).casefold()
    # only the form a spreadsheet writes (1 saved as 1.0): '01' and '1', or 2**53 and 2**53 + 1, stay apart
    whole = _WHOLE_NUMBER.fullmatch(words)
    return whole.group(1) if whole else words


_WHOLE_NUMBER = re.compile(r"([+-]?\d+)\.0+")


def variant_problems(row_labels: list[list[str] | None], row_name: Callable[[int], str]) -> list[RowProblem]:
    """A whole-file problem (row 0) per group of labels equal but for case and spacing, naming each spelling with
    its number of rows and the first of them (`row_name(i)` names the frame's row i)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for names in row_labels:
        for name in names or ():
            groups[label_key(name)].add(name)
    clashing = {name for spellings in groups.values() if len(spellings) > 1 for name in spellings}
    if not clashing:
        return []
    first: dict[str, int] = {}
    count: Counter[str] = Counter()
    for i, names in enumerate(row_labels):
        for name in set(names or ()) & clashing:
            first.setdefault(name, i)
            count[name] += 1
    problems = []
    for spellings in groups.values():
        if len(spellings) > 1:
            told = " and ".join(f"{name!r} ({count[name]} row(s), first {row_name(first[name])})"
                                for name in sorted(spellings))
            problems.append(RowProblem(0, f"labels {told} differ only in case, spacing or number format, so they "
                                          f"would be {len(spellings)} separate classes: write them alike in the "
                                          "file, or, if they are different labels, give the label set (the import "
                                          "form's labels box; evopool run --label NAME, one per class)"))
    return problems
