"""Every session-state and query-parameter key the studio uses, in one place.

The workspace and the annotator being edited also live in the URL (`?ws=…&annotator=…`), so a reload
or a shared link lands on the same screen.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

# query parameters
QP_WORKSPACE = "ws"
QP_ANNOTATOR = "annotator"

# session-state keys
WORKSPACE = "workspace"  # selected workspace name
ANNOTATOR = "annotator_id"  # annotator open in the Annotator screen
PICK_ANNOTATOR = "pick_annotator"  # the Annotator screen's picker widget (kept equal to ANNOTATOR)
SKIP_BAD_ROWS = "skip_bad_rows"
LAST_IMPORT = "last_import"  # ImportReport of the demo import (shown once, on the next run)
IMPORT_SHOWN = "import_shown"  # id of the import job whose report was shown
AGGREGATOR = "aggregator"
EDIT_PREVIEW = "edit_preview"  # (annotator id, source, EditPreview)
PLAIN_EDITOR = "plain_editor"
IMPORT_ASKED = "import_asked"  # the file and settings the last import was started with (`importer.asked`)
IMPORT_DESCRIPTIONS = "import_descriptions"  # {label: description} typed in the import form, whatever the label set
WORKSPACE_PICKER = "ws_picker"  # the sidebar's workspace picker widget (set to the open workspace before it is drawn)
NEW_ANNOTATOR = "new_annotator_result"  # (source, name, review.submit's answer): the last new annotator submitted
LAST_VERDICT = "last_verdict"  # the annotator the expert last gave (or undid) a verdict on: its card stays open
CODE_DRAFTS = "code_drafts"  # {annotator id: edited source}: an edit survives a visit to another screen
DRAFT_RESETS = "draft_resets"  # {annotator id: n}: a discarded draft's editor starts afresh under a new key
FLASH = "flash"  # a message to show once after a rerun
ASKING = "asking_"  # + an action key: its confirmation dialog is open
CONFIRMED = "confirmed_"  # + an action key: confirmed, act on this run
DESCRIBE_UNDO = "describe_last_save"  # studio.describe_ui.LastSave: what the last save can undo
DESCRIBE_TEXT = "describe_text_"  # + DESCRIBE_VERSION + "_" + a label: its description box
DESCRIBE_OPEN = "describe_open"  # the expert has used "Describe a label": keep it open across reruns
DESCRIBE_VERSION = "describe_version"  # bumped by a save, an undo or a workspace switch: fresh boxes
EXPERT_NAME = "expert_name"  # who labels rows into dev (recorded with them)
TEACH_QUEUE = "teach_queue"  # (workspace, [Suggestion dict]): the rows the queue picked, not yet labeled or skipped
TEACH_SKIPPED = "teach_skipped"  # ids skipped this session: not suggested again until the queue is refilled
TEACH_DONE = "teach_done"  # [(id, label)] labeled on the keyboard screen this session, newest last (undo reads it)
GROW_CLASS = "grow_class"  # the class whose likely unlabeled rows the Labels screen lists to label into dev
GROW_CLASS_WHO = "grow_class_who"  # who labels those rows (its own widget; defaults to EXPERT_NAME)
RETURN_OPEN = "expert_rows_open"  # rows were returned to the pool: keep their record open across the rerun
RETURN_VERSION = "return_rows_version"  # bumped by each return: a fresh row chooser (its old choice is gone)
RETURN_ASKED = "return_rows_asked"  # the ids the expert asked to return to the pool, until confirmed
RETURN_CONFIRM = "return_rows"  # the confirmation dialog's key (`widgets.confirm`)
LAST_DELETED = "last_deleted_workspace"  # the trash folder of the workspace this session deleted last (its undo)


KEPT = "kept_widgets"  # {widget key: its last value}, for when Streamlit forgot the widget (another screen shown)


def get(key: str, default: Any = None) -> Any:
    return st.session_state.get(key, default)


def kept(key: str, default: Any = None) -> Any:
    """A widget's last value as `keep` saved it: Streamlit drops the state of a widget a run does not draw, so an
    expert back from another screen found the aggregator, the generation and their name reset. A widget takes it as
    its default (never set through the Session State API, which a default beside would warn about)."""
    return (st.session_state.get(KEPT) or {}).get(key, default)


def keep(key: str, value: Any) -> None:
    st.session_state[KEPT] = {**(st.session_state.get(KEPT) or {}), key: value}


def put(key: str, value: Any) -> None:
    st.session_state[key] = value


def pop(key: str, default: Any = None) -> Any:
    return st.session_state.pop(key, default)


def new_describe_boxes() -> None:
    """New keys for the description boxes: fresh widgets show what is stored (deleting a widget's state does not
    reach the browser, which would send the old draft back)."""
    st.session_state[DESCRIBE_VERSION] = st.session_state.get(DESCRIBE_VERSION, 0) + 1


def workspace_name() -> str | None:
    """The selected workspace: session first, then the URL (kept in the session: page links drop the URL's)."""
    name = st.session_state.get(WORKSPACE)
    if not name and st.query_params.get(QP_WORKSPACE):
        name = st.session_state[WORKSPACE] = st.query_params[QP_WORKSPACE]
    return name or None


def select_workspace(name: str | None) -> None:
    st.session_state[WORKSPACE] = name
    if name:
        st.query_params[QP_WORKSPACE] = name
    elif QP_WORKSPACE in st.query_params:
        del st.query_params[QP_WORKSPACE]
    new_describe_boxes()  # another workspace's drafts go
    # ...and a confirmation asked there (rows to return are that workspace's rows)
    for key in (ANNOTATOR, EDIT_PREVIEW, CODE_DRAFTS, IMPORT_ASKED, IMPORT_DESCRIPTIONS, KEPT, LAST_IMPORT,
                DESCRIBE_UNDO, DESCRIBE_OPEN, RETURN_ASKED, ASKING + RETURN_CONFIRM, NEW_ANNOTATOR):
        st.session_state.pop(key, None)
    if QP_ANNOTATOR in st.query_params:
        del st.query_params[QP_ANNOTATOR]


def annotator_id() -> str | None:
    """The annotator open in the Annotator screen: session first, then the URL."""
    found = st.session_state.get(ANNOTATOR)
    if not found and st.query_params.get(QP_ANNOTATOR):
        found = st.session_state[ANNOTATOR] = st.query_params[QP_ANNOTATOR]
    elif found and st.query_params.get(QP_ANNOTATOR) != found:  # a page link dropped it: the URL names it again
        st.query_params[QP_ANNOTATOR] = found
    return found or None


def select_annotator(annotator: str | None) -> None:
    if annotator != st.session_state.get(ANNOTATOR):
        st.session_state.pop(EDIT_PREVIEW, None)  # a preview is of the open annotator's draft (drafts stay, per id)
    st.session_state[ANNOTATOR] = annotator
    if annotator:
        st.query_params[QP_ANNOTATOR] = annotator
    elif QP_ANNOTATOR in st.query_params:
        del st.query_params[QP_ANNOTATOR]


def flash(message: str, kind: str = "success") -> None:
    """Show `message` once, at the top of the next run (after st.rerun)."""
    st.session_state[FLASH] = (kind, message)


def show_flash() -> None:
    item = st.session_state.pop(FLASH, None)
    if item:
        kind, message = item
        {"success": st.success, "info": st.info, "warning": st.warning, "error": st.error}[kind](message)
