"""A proposer's candidate made an `Annotator`: checked, normalised, named (its docstring's first line, else its
agent and code hash) and identified by its code hash."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from engine.sandbox.checks import checked, clean_text
from engine.sandbox.replies import extract_code

if TYPE_CHECKING:
    from engine.domain import Annotator, Candidate


def make_annotator(candidate: Candidate, generation: int, author: str = "agent") -> Annotator:
    """Check and normalise a proposer's candidate into an `Annotator` whose id is its code hash."""
    from engine.domain import Annotator, code_hash  # runtime import: keeps numpy out of the worker

    source = candidate.source
    if "```" in source:
        source = extract_code(source)
    tree, normalised = checked(source)
    annotator_id = code_hash(normalised)
    name = clean_text(candidate.name.strip() or _docstring_title(tree) or f"{candidate.agent}-{annotator_id[:6]}")
    return Annotator(
        id=annotator_id,
        name=name,
        source=normalised,
        agent=candidate.agent,
        generation=generation,
        parent_ids=tuple(candidate.parent_ids),
        author=author,
        rationale=clean_text(candidate.rationale),
        mined_on_guesses=candidate.mined_on_guesses,
    )


def docstring_title(source: str) -> str:
    """The name `make_annotator` reads from a source's `annotate` docstring ("" when it has none or does not
    parse)."""
    try:
        return _docstring_title(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""


def _docstring_title(tree: ast.Module) -> str:
    """First non-empty line of `annotate`'s docstring, trimmed to a short name."""
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "annotate":
            doc = ast.get_docstring(stmt) or ""
            for text_line in doc.splitlines():
                if text_line.strip():
                    return text_line.strip()[:80]
    return ""
