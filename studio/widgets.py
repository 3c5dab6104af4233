"""Shared pieces of every screen: the header, the sidebar (workspace picker, job status), guards."""
from __future__ import annotations

import runpy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.jobs import REGISTRY, Job
from engine.store.workspace import Store, WorkspaceLocked, WorkspaceUnavailable
from studio import queries, state, workspace
from studio.refresh import AppRefresh, poll_job

APP_NAME = "EvoPool Studio"
PROJECT_PAGE = "pages/project.py"
APP_SCRIPT = Path(__file__).resolve().parents[1] / "streamlit_app.py"
LOGO = ('<svg xmlns="http://www.w3.org/2000/svg" width="210" height="36" viewBox="0 0 210 36">'
        '<circle cx="14" cy="18" r="12" fill="#2f6f5e"/><circle cx="14" cy="18" r="5" fill="#ffffff"/>'
        '<circle cx="26" cy="9" r="5" fill="#7fb8a4"/>'
        '<text x="40" y="25" font-family="Source Sans Pro, Helvetica, Arial, sans-serif" font-size="20" '
        'font-weight="700" fill="#1f3d34">EvoPool Studio</text></svg>')


_FRAME = threading.local()


@contextmanager
def frame() -> Iterator[None]:
    """Marks a page run as happening inside streamlit_app.py (see `_inside_frame`)."""
    _FRAME.on = True
    try:
        yield
    finally:
        _FRAME.on = False


def _inside_frame() -> None:
    """Streamlit runs a `pages/` script on its own (its legacy pages-folder mode) when a fresh server's first
    request is a deep link, e.g. a reload on /evolve. Then run the frame instead, in this same script run (so
    no click is lost): streamlit_app.py sets up the page, navigation and sidebar and runs this page inside
    them; then this bare run stops. Switching the legacy mode off makes later runs start at the frame."""
    if not getattr(_FRAME, "on", False):
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
        runpy.run_path(str(APP_SCRIPT), run_name="__main__")
        st.stop()


def header(title: str, caption: str = "") -> None:
    """Every screen says it is EvoPool Studio, which screen it is, and on which workspace."""
    _inside_frame()
    name = state.workspace_name()
    st.title(title)
    where = f"workspace **{name}**" if name else "no workspace open"
    task_name = _task_name(name) if name else None
    if task_name and task_name != name:
        where += f" · task **{queries.escape_md(task_name)}**"
    st.caption(f"{APP_NAME} · {where}" + (f" · {caption}" if caption else ""))
    state.show_flash()


def _task_name(name: str) -> str | None:
    """The open workspace's task name, for the banner (None before data is imported)."""
    if not workspace.exists(name):
        return None
    try:
        store = workspace.open_store(name)
    except WorkspaceUnavailable:  # locked or damaged: the page's own store check says so, in words
        return None
    return store.load_task().name if store.has_data() else None


def current_store() -> Store | None:
    """The open workspace's store, or None; a locked or broken workspace is an error message."""
    name = state.workspace_name()
    if not name:
        return None
    if workspace.check_name(name) or not workspace.exists(name):
        st.warning(f"Workspace {name!r} does not exist (any more). Pick or create one.")
        state.select_workspace(None)
        return None
    try:
        return workspace.open_store(name)
    except WorkspaceUnavailable as err:
        st.error(str(err))
        return None


def require_data() -> Store:
    """The open workspace with data in it; otherwise say what to do and stop the page."""
    store = current_store()
    if store is None or not store.has_data():
        st.info("Open a workspace with data first (or load the demo) on **Project & data**.")
        st.page_link(PROJECT_PAGE, label="Go to Project & data", icon=":material/folder_open:")
        st.stop()
    return store


def require_pool(store: Store) -> list[str]:
    pool = store.pool_ids()
    if not pool:
        st.info("The pool is empty: run at least one generation on **Evolve** first.")
        st.page_link("pages/evolve.py", label="Go to Evolve", icon=":material/science:")
        st.stop()
    return pool


PICKER = state.WORKSPACE_PICKER


def _picked() -> None:
    chosen = st.session_state.get(PICKER)
    if chosen and chosen != state.workspace_name():
        state.select_workspace(chosen)


# set by an authenticating proxy in front of the studio (oauth2-proxy, Authelia, a web server's basic auth)
PROXY_USER_HEADERS = ("X-Forwarded-User", "X-Auth-Request-User", "X-Forwarded-Preferred-Username",
                      "X-Forwarded-Email", "X-Auth-Request-Email", "Remote-User")
WHO = "who_input"  # the sidebar's name box


def proxy_user() -> str:
    """The login an authenticating proxy passed on, or "" (the studio reached directly)."""
    try:
        headers = st.context.headers
    except Exception:  # noqa: BLE001 - no request context (AppTest): nobody signed in
        return ""
    return next((str(headers.get(h)).strip() for h in PROXY_USER_HEADERS if headers.get(h)), "")


def who() -> None:
    """Who this session is: the proxy's login, else a name asked once in the sidebar. Every verdict, edit, label and
    description the session records carries it (`engine.store.actor`), and so do its labels into dev."""
    signed_in = proxy_user()
    if signed_in:
        state.keep(state.EXPERT_NAME, signed_in)
        st.caption(f":material/person: {queries.escape_md(signed_in)}")
        return
    kept = state.kept(state.EXPERT_NAME, "")
    if st.session_state.get(WHO) != kept:  # a new session, or the name given in a labeling form since
        st.session_state[WHO] = kept
    st.text_input("Your name", key=WHO, placeholder="who is reviewing", on_change=_named,
                  help="Recorded with your verdicts, edits, labels and descriptions, so a team sees who did what; "
                       "asked once per browser session")


def _named() -> None:
    state.keep(state.EXPERT_NAME, str(st.session_state.get(WHO) or "").strip())


def sidebar() -> None:
    """Who is working, the workspace picker, its facts, and the status of its jobs."""
    with st.sidebar:
        st.logo(LOGO, size="large")
        who()
        names = workspace.list_workspaces()
        current = state.workspace_name()
        if current and current not in names and workspace.exists(current):
            names.insert(0, current)
        if names:
            # one picker whose value is set to the workspace open before it is drawn, and a pick that takes effect
            # in its callback: a picker keyed per workspace kept a stale pick when a rerun was cut short (a job's
            # refresh), and two such pickers sent the studio back and forth between two workspaces without end
            shown = current if current in names else None
            if st.session_state.get(PICKER) != shown:
                st.session_state[PICKER] = shown
            st.selectbox("Workspace", names, placeholder="Pick a workspace", key=PICKER, on_change=_picked)
        else:
            st.caption("No workspace yet: create one or load the demo on Project & data.")
        if current and workspace.exists(current):
            _job_status(current)


def _facts(name: str) -> bool:
    """The workspace's task, rows, labels, generation and pool in one caption; False when it cannot be opened."""
    try:
        facts = workspace.summary(name)
    except WorkspaceLocked:
        st.error("This workspace is open in another program (an `evopool` run or another studio).")
        return False
    except WorkspaceUnavailable as err:
        st.error(str(err))
        return False
    if facts["rows"]:
        st.caption(f"{queries.escape_md(facts['task'])} · {facts['rows']:,} rows · labels "
                   f"{queries.escape_md(', '.join(facts['labels']))}  \n"
                   f"generation {facts['generation']} · {facts['pool']} annotator"
                   f"{'' if facts['pool'] == 1 else 's'} in the pool")
    return True


def _job_status(name: str) -> None:
    """The facts and the jobs of the workspace; while a job runs both are redrawn live (a generation completing
    mid-run changes the pool: the sidebar said "generation 0 · 0 annotators" until the run ended)."""
    running = REGISTRY.all_running(workspace.workdir(name))
    if not running:
        if _facts(name):
            _job_lines(name)
        return

    ids = [job.id for job in running]

    def live(refresh_app: AppRefresh) -> None:
        jobs = [job for job in map(REGISTRY.get, ids) if job is not None]
        # a finished job changes what the screens show, so the app redraws; the embeddings do not (the soft labels
        # read them when asked), and a redraw at a moment of their choosing would cut into the expert's typing
        if any(not job.running and job.kind != "embed" for job in jobs):
            refresh_app()
        if not _facts(name):
            return
        for job in jobs:
            _job_line(job)

    poll_job(live, 1.5)


def _job_lines(name: str) -> None:
    for kind in ("embed", "evolve", "labels", "corpus"):
        job = REGISTRY.latest(workspace.workdir(name), kind)
        if job is not None:
            _job_line(job)


def _job_line(job: Job) -> None:
    label = {"evolve": "Evolving", "labels": "Soft labels", "corpus": "Corpus labels", "embed": "Embeddings",
             "import": "Importing"}.get(job.kind, job.kind)
    if job.running:
        st.progress(min(1.0, max(0.0, job.progress)), text=f"{label}: {job.message}")
        if job.kind == "embed" and st.button("Stop embedding", key=f"stop_{job.id}", type="tertiary",
                                             icon=":material/stop:", help="What is embedded is kept; the soft "
                                             "labels embed the rest when they are computed"):
            job.stop(now=True)
    elif job.status == "failed":
        st.error(f"{label} failed: {queries.escape_md(job.error)}")
    else:
        st.caption(f":material/check: {label}: {job.status}")


def confirm(key: str, question: str, action_label: str = "Yes, do it") -> bool:
    """A two-step confirmation for actions that discard work: True on the run where it is confirmed."""
    if st.session_state.get(state.CONFIRMED + key):
        st.session_state.pop(state.CONFIRMED + key)
        return True
    if not st.session_state.get(state.ASKING + key):
        return False

    def dismissed() -> None:
        st.session_state.pop(state.ASKING + key, None)

    @st.dialog("Please confirm", on_dismiss=dismissed)
    def ask() -> None:
        st.write(question)
        yes, no = st.columns(2)
        if yes.button(action_label, type="primary", key=f"yes_{key}"):
            st.session_state[state.CONFIRMED + key] = True
            st.session_state.pop(state.ASKING + key, None)
            st.rerun()
        if no.button("Cancel", key=f"no_{key}"):
            st.session_state.pop(state.ASKING + key, None)
            st.rerun()

    ask()
    return False


def ask_confirm(key: str) -> None:
    """Open the confirmation dialog `confirm(key, …)` renders on the next run."""
    st.session_state[state.ASKING + key] = True


def secrets() -> dict:
    """st.secrets as a plain dict; empty when the app has no secrets file."""
    try:
        return {k: st.secrets[k] for k in st.secrets}
    except Exception:  # no secrets.toml: Streamlit raises on first access
        return {}


def default_from(key: str, source: object, default: object) -> None:
    """Give the box `key` the value `default` whenever `source` (what the default was worked out from) differs
    from last time: a keyed box keeps what it holds, so a default passed as `value=` never reaches it again (another
    file's label set, another workspace's folder). Call before the box, and create the box without `value=`."""
    mark = f"{key}__default_from"
    if key not in st.session_state or st.session_state.get(mark) != source:
        st.session_state[key] = default
        st.session_state[mark] = source


def name_a_few(names: list[str], limit: int, noun: str = "") -> str:
    """The first `limit` of `names` (already formatted as markdown), joined by commas, and past that
    "and N more <noun>": a line that stays a line for a task with hundreds of labels (`table_of_all` lists them)."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit:,} more" + (f" {noun}" if noun else "") if len(names) > limit else "")


def table_of_all(rows: list, columns: list[str], limit: int, title: str) -> None:
    """Past `limit` rows, every one of them in a table under an expander (what `name_a_few` left unnamed)."""
    if len(rows) > limit:
        with st.expander(title):
            st.dataframe(pd.DataFrame(rows, columns=columns), hide_index=True)
