"""Data, model and annotator text made safe to show as markdown (Streamlit renders links and remote images).

Names, labels and error texts come from files, LLMs and other users: a name like `![x](https://host/p.png)` would
load an image, `[sign in](https://host)` would plant a link. The engine writes some of its explanations in
markdown (bold labels), so the escaping lives here, beside them, and the studio uses the same helpers.
"""
from __future__ import annotations

import re
import string

_PUNCT = set(string.punctuation)
_NO_AUTOLINK = re.compile(r"(?i)(www\.|://|@)")  # a zero-width space here stops markdown making links


def code_span(text: object) -> str:
    """Text as an inline code span for st.markdown, whatever backticks it holds: fenced by a longer run of them
    (CommonMark), spaced where it starts or ends with one; newlines become spaces."""
    text = re.sub(r"\s+", " ", str(text))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def escape_md(text: object, strip: bool = True) -> str:
    """Data or model text made inert for st.markdown: every ASCII punctuation mark backslash-escaped,
    whitespace runs (newlines would start new markdown blocks) turned into single spaces."""
    text = _NO_AUTOLINK.sub(lambda m: m.group(0)[:-1] + "\u200b" + m.group(0)[-1], str(text))
    out = "".join("\\" + ch if ch in _PUNCT else ch for ch in text)
    out = re.sub(r"\s+", " ", out)
    return out.strip() if strip else out
