"""Which column holds the text: chosen by content, so an id or code column is never taken for it.

A file's text column is the one annotators read. A name like `text` is a strong hint; without one, the
column with the longest free text (cells with several words, mostly distinct) is the text; short single-token
columns (ids such as `clause_id`, codes, labels) never are.
"""
from __future__ import annotations

import pandas as pd

TEXT_NAMES = ("text", "sentence", "content", "body", "comment", "document", "clause", "abstract")
SAMPLE_ROWS = 2000


def free_text_score(values: pd.Series) -> float:
    """Mean words per non-empty cell of a sample, 0 for columns that do not read like free text."""
    sample = values.dropna().head(SAMPLE_ROWS)
    if sample.empty or not all(isinstance(v, str) for v in sample.head(50)):
        return 0.0
    cells = sample.astype(str).str.strip()
    cells = cells[cells != ""]
    if cells.empty:
        return 0.0
    words = cells.str.split().str.len()
    if words.median() < 2 or cells.nunique() < 0.5 * len(cells):  # single tokens, or a few repeated values
        return 0.0
    return float(words.mean())


def choose_text_column(frame: pd.DataFrame) -> str | None:
    """The text column: a conventionally named free-text column, else the one with the longest free text."""
    exact = [str(c) for c in frame.columns if str(c).lower() == "text"]
    if exact:
        return exact[0]
    scores = {str(c): free_text_score(frame[c]) for c in frame.columns}
    named = [c for c in scores if c.lower() in TEXT_NAMES and scores[c] > 0]
    if named:
        return named[0]
    best = max(scores, key=lambda c: scores[c], default=None)
    return best if best is not None and scores[best] > 0 else None
