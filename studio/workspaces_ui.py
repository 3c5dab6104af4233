"""Managing workspaces: what each holds, rename the open one, delete one (into the trash, with undo), restore."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.jobs import REGISTRY, start_embed
from engine.store import workspaces
from engine.store.workspace import WorkspaceUnavailable
from studio import queries, state, widgets, workspace

DELETE_CONFIRM = "delete_workspace"


def manage() -> None:
    """The table of workspaces and the rename / delete / restore forms."""
    names = workspace.list_workspaces(empty_too=True)
    if not names:
        st.caption("No workspace yet.")
    else:
        held = [workspace.holding(n) for n in names]
        st.dataframe(pd.DataFrame([{
            "workspace": h.name, "rows": h.rows, "dev rows": h.dev_rows, "generation": h.generations,
            "annotators in the pool": h.pool, "expert verdicts": h.expert_actions,
            "MB on disk": round(h.bytes_on_disk / 1e6, 1),
            "state": "in use by another process" if h.rows is None else "empty" if h.empty else "",
        } for h in held]), hide_index=True)
        _rename()
        _delete(names)
    _restore()


def _blocking_job(name: str) -> str | None:
    """Why the workspace cannot be moved now (a job of this studio other than embedding ahead runs on it), or None."""
    blocking = next((job for job in REGISTRY.all_running(workspace.workdir(name)) if job.kind != "embed"), None)
    return None if blocking is None else f"a {blocking.kind} job is running on {name}: wait for it or stop it first"


def _stop_embedding(name: str) -> tuple[str | None, bool]:
    """Stop the workspace's embedding ahead before it moves (what it saved stays): (why it could not yet, or None;
    whether one was running, to start it again where the workspace went)."""
    running = [job for job in REGISTRY.all_running(workspace.workdir(name)) if job.kind == "embed"]
    for job in running:
        job.stop(now=True)  # it stops at its next batch; the screen does not wait long for that
        if not job.wait(3):
            return "its embedding is stopping; try again in a moment", True
    return None, bool(running)


def _rename() -> None:
    current = state.workspace_name()
    if not current or not workspace.exists(current):
        return
    with st.form("rename_workspace", border=False):
        new = st.text_input(f"Rename the open workspace ({current}) to", key="rename_ws_to")
        clicked = st.form_submit_button("Rename", icon=":material/edit:")
    if not clicked:
        return
    new = new.strip()
    problem = workspace.check_name(new) or _blocking_job(current)
    stopped = False
    if problem is None:
        problem, stopped = _stop_embedding(current)
    if problem:
        st.error(f"Not renamed: {problem}.")
        return
    try:
        workspaces.rename(workspace.home(), current, new)
    except (FileExistsError, WorkspaceUnavailable, OSError) as err:
        st.error(f"Not renamed: {err}")
        return
    if stopped:  # the work ahead goes on under the new name, from what it had saved
        start_embed(workspace.workdir(new))
    state.select_workspace(new)
    state.flash(f"Renamed {queries.escape_md(current)} to {queries.escape_md(new)}.")
    st.rerun()


def _delete(names: list[str]) -> None:
    current = state.workspace_name()
    chosen = st.selectbox("Workspace to delete", names, index=names.index(current) if current in names else 0,
                          key="delete_ws_pick")
    held = workspace.holding(chosen)
    st.caption(f"It holds: {queries.escape_md(held.sentence())}. Deleting moves it to the trash "
               f"(`{workspace.home() / workspaces.TRASH}`): you can restore it here until the trash is emptied.")
    if widgets.confirm(DELETE_CONFIRM, f"Delete workspace **{queries.escape_md(chosen)}**? "
                       f"{queries.escape_md(held.sentence())}.", "Delete it"):
        problem = _blocking_job(chosen) or _stop_embedding(chosen)[0]
        if problem:
            st.error(f"Not deleted: {problem}.")
            return
        try:
            where = workspaces.delete(workspace.home(), chosen)
        except (WorkspaceUnavailable, OSError) as err:
            st.error(f"Not deleted: {err}")
            return
        if current == chosen:
            state.select_workspace(None)
        state.put(state.LAST_DELETED, str(where))
        state.flash(f"Deleted {queries.escape_md(chosen)} (moved to the trash).")
        st.rerun()
    if st.button(f"Delete {chosen}…", icon=":material/delete:", key="delete_ws"):
        widgets.ask_confirm(DELETE_CONFIRM)
        st.rerun()


def undo_last_delete() -> None:
    """The undo of this session's last delete, in plain sight (not inside a panel that may be closed)."""
    last = state.get(state.LAST_DELETED)
    if not last:
        return
    deleted = workspaces.trashed(workspace.home())
    match = [p for p in deleted if str(p) == last]
    if not match:
        state.pop(state.LAST_DELETED)
        return
    name = match[0].name.rsplit("@", 1)[0]
    if st.button(f"Undo: restore {name}", icon=":material/undo:", key="undo_delete_ws"):
        _bring_back(match[0])


def _restore() -> None:
    deleted = workspaces.trashed(workspace.home())
    if not deleted:
        return
    labels = {f"{p.name.rsplit('@', 1)[0]} (deleted {p.name.rsplit('@', 1)[1][:15]})": p for p in deleted}
    chosen = st.selectbox("Deleted workspaces", list(labels), key="restore_ws_pick")
    if st.button("Restore", icon=":material/restore_from_trash:", key="restore_ws"):
        _bring_back(labels[chosen])


def _bring_back(deleted) -> None:
    try:
        name = workspaces.restore(workspace.home(), deleted)
    except (FileExistsError, OSError) as err:
        st.error(f"Not restored: {err}")
        return
    state.pop(state.LAST_DELETED)
    state.select_workspace(name)
    state.flash(f"Restored workspace {queries.escape_md(name)}.")
    st.rerun()
