"""The code editor, the server's sandboxes for quick re-scoring, and highlighting why an annotator fired."""
from __future__ import annotations

import ast
import re
from contextlib import AbstractContextManager

import streamlit as st

from engine.sandbox.executor import SandboxExecutor
from engine.store.workspace import Store
from studio import queries, state
from studio.sandboxes import SandboxLeases

try:  # Ace editor component (bundled JS, works offline); the plain text area is the fallback
    from streamlit_ace import st_ace
except ImportError:  # pragma: no cover - depends on the environment
    st_ace = None

MAX_HIGHLIGHTS = 40


@st.cache_resource(show_spinner=False, on_release=SandboxLeases.close)  # "Clear cache" stops the idle workers
def _quick_sandboxes() -> SandboxLeases:
    return SandboxLeases()


def sandbox() -> AbstractContextManager[SandboxExecutor]:
    """A warm sandbox of the server's for one quick run (`with editor.sandbox() as executor:`); jobs use their own.
    Two experts' previews run side by side, up to studio.sandboxes.QUICK_SANDBOXES at once."""
    return _quick_sandboxes().lease()


@st.cache_resource(show_spinner=False)
def _containment() -> dict[str, str]:
    """The machine's containment layers, read once per server (not cached when the sandbox fails to start): a page
    that drew them on every rerun waited for a free sandbox while three experts' runs had them all."""
    with sandbox() as executor:
        return executor.containment()


def containment_note() -> None:
    """How contained annotator code is on this machine (see docs/SECURITY.md); layers that are off, loudly."""
    try:
        layers = _containment()
    except (OSError, RuntimeError) as exc:
        st.error(f"The sandbox did not start: {exc}")
        return
    off = [name for name, status in layers.items() if not status.startswith("on")]
    title = f"Sandbox: {len(layers) - len(off)} of {len(layers)} layers on"
    with st.expander(title + (f" — OFF: {', '.join(off)}" if off else ""), icon=":material/shield:"):
        for name, status in layers.items():
            st.caption(f"**{name}**: {queries.escape_md(status)}")


def code_editor(source: str, key: str, store: Store | None = None) -> str:
    """Edit annotator code with Python highlighting; a plain text area on request (or without the component).
    The edit is kept per `key` (the annotator's id) in the session, not only in the widget, which Streamlit
    forgets when the expert opens another screen: coming back shows the draft, and its re-score, again. With a
    `store`, it is also kept in the workspace, so a reload (a new session) finds it too."""
    drafts: dict[str, str] = state.get(state.CODE_DRAFTS) or {}
    kept = store.draft(key) if store is not None and key not in drafts else None
    if kept is not None and kept[0].strip() != source.strip():
        drafts = {**drafts, key: kept[0]}  # an edit left unsaved in an earlier session
        state.put(state.CODE_DRAFTS, drafts)
        st.info(f"An unsaved edit of this annotator, from {kept[1]:%Y-%m-%d %H:%M} UTC, is back in the editor (the "
                "workspace kept it): re-score and save it as a new version, or **Discard the edit**.",
                icon=":material/history:")
    shown = drafts.get(key, source)
    chosen = st.toggle("Plain text editor", key=state.PLAIN_EDITOR, value=bool(state.kept(state.PLAIN_EDITOR)),
                       help="use a plain text box instead of the code editor (for screen readers, or to paste "
                            "code)")
    state.keep(state.PLAIN_EDITOR, chosen)
    plain = chosen or st_ace is None
    resets = (state.get(state.DRAFT_RESETS) or {}).get(key, 0)
    fresh = f"_{resets}" if resets else ""  # a new widget after "Discard the edit": it starts from the saved code
    if plain:
        edited = st.text_area("Annotator code", shown, height=360, key=f"plain_{key}{fresh}")
    else:
        st.caption("Edit, then press **Apply** (or Ctrl+Enter) in the editor before re-scoring.")
        value = st_ace(value=shown, language="python", theme="chrome", keybinding="vscode", min_lines=14,
                       max_lines=40, font_size=14, tab_size=4, wrap=True, show_gutter=True, key=f"ace_{key}{fresh}")
        edited = shown if value is None else str(value)
    if edited.strip() != source.strip():
        if store is not None and drafts.get(key) != edited:  # written when it changes, not read back every run
            store.save_draft(key, edited)
        state.put(state.CODE_DRAFTS, {**drafts, key: edited})
        if st.button("Discard the edit", icon=":material/restart_alt:", key=f"discard_{key}",
                     help="back to the saved code (the edit is not kept anywhere)"):
            drop_draft(key, store)
            st.rerun()
    elif key in drafts:
        drop_draft(key, store)
    return edited


def drop_draft(key: str, store: Store | None = None) -> None:
    """Forget the edit kept for `key` (in the workspace too, with a `store`): the editor shows the saved code again
    (after a save, or on request)."""
    if store is not None:
        store.drop_draft(key)
    drafts = dict(state.get(state.CODE_DRAFTS) or {})
    drafts.pop(key, None)
    state.put(state.CODE_DRAFTS, drafts)
    resets = dict(state.get(state.DRAFT_RESETS) or {})
    resets[key] = resets.get(key, 0) + 1
    state.put(state.DRAFT_RESETS, resets)
    state.pop(state.EDIT_PREVIEW)


def cue_words(source: str, exclude: set[str] = frozenset(), limit: int = MAX_HIGHLIGHTS) -> list[str]:
    """The words the code looks for: its string constants that are plain words or phrases.

    Regex-like strings, docstrings, label and field names are left out; a trailing '*' (a stem) is kept
    and matched as a word prefix. One-letter words stay: a cue "a" (longer spam comments say it more) is what the
    annotator looks for, and `highlighted` marks it only as a whole word.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    skip = {e.lower() for e in exclude} | {"text"}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.strip()
            if _WORDY.match(word) and word.lower() not in skip:
                found.add(word.lower())
    return sorted(found, key=lambda w: (-len(w), w))[:limit]


_WORDY = re.compile(r"^[^\W_][\w' -]{0,40}\*?$")


def highlighted(text: str, needles: list[str]) -> str:
    """Markdown of `text` with every needle found in it (case-insensitive) on an orange background.

    The text is escaped piece by piece, so nothing in the data can become markup.
    """
    needles = [n for n in needles if n]
    if not needles:
        return queries.escape_md(text)
    alternatives = [re.escape(n.rstrip("*")) + (r"\w*" if n.endswith("*") else r"\b") for n in needles]
    pattern = re.compile(r"\b(?:" + "|".join(alternatives) + ")", re.IGNORECASE)
    out, pos = [], 0
    for match in pattern.finditer(text):
        if match.start() == match.end():
            continue
        out.append(queries.escape_md(text[pos:match.start()], strip=False))
        out.append(f":orange-background[**{queries.escape_md(match.group())}**]")
        pos = match.end()
    out.append(queries.escape_md(text[pos:], strip=False))
    return "".join(out).strip()
