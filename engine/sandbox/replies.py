"""Code out of an LLM reply: the fenced blocks of a reply (one fence grammar for code replies, spec replies and the
editor) and the annotator source among them."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from engine.sandbox.checks import CodeRejected

# a fence opens at the start of a line (a reply's inline ```code``` span is prose) and closes at the start of a later
# one, or the block runs to the end of the reply (a reply cut off inside it)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:(^[ \t]*```)|\Z)", re.DOTALL | re.MULTILINE)
_DEFINES_ANNOTATE = re.compile(r"^\s*def\s+annotate\s*\(", re.MULTILINE)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


@dataclass(frozen=True)
class Fenced:
    """One fenced block of a reply: its tag (``python`` -> "python"), its body, where it spans in the reply, and
    whether its closing fence came (False: the reply ended inside it)."""

    tag: str
    body: str
    start: int
    end: int
    closed: bool

    @property
    def python(self) -> bool:
        """Tagged python (or untagged) and not empty: a block that may hold code."""
        return self.tag.lower() in _PYTHON_TAGS and bool(self.body.strip())


def fenced_blocks(text: str) -> list[Fenced]:
    """Every fenced block of `text` in order (the one fence grammar of code replies, spec replies and the editor)."""
    return [Fenced(m.group(1), m.group(2), m.start(), m.end(), m.group(3) is not None) for m in _FENCE.finditer(text)]


def extract_code(text: str) -> str:
    """Pull the annotator source out of an LLM reply.

    Fenced blocks tagged python (or untagged) win; among several, the last one defining `annotate`
    (a reply's revised version usually comes last). Unfenced text is taken as-is when it parses as code.
    """
    blocks = [block.body for block in fenced_blocks(text) if block.python]
    if blocks:
        with_annotate = [b for b in blocks if _DEFINES_ANNOTATE.search(b)]
        chosen = with_annotate[-1] if with_annotate else blocks[0]
        return chosen.strip("\n") + "\n"
    if "```" not in text and _looks_like_code(text):
        return text.strip("\n") + "\n"
    raise CodeRejected("no code block found")


def _looks_like_code(text: str) -> bool:
    """Prose can parse as Python (`hello`), so require a definition, import or assignment."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    kinds = (ast.FunctionDef, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)
    return any(isinstance(node, kinds) for node in tree.body)
