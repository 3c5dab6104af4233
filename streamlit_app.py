"""EvoPool Studio: the frame around every screen (page config, navigation, the shared sidebar).

Run with `make run` (or `streamlit run streamlit_app.py`). Workspaces live under $EVOPOOL_HOME
(default ./workspaces); the selected one is kept in the URL (`?ws=name`), so a reload keeps it.
"""
import streamlit as st

from engine.store.actor import resolve_expert_with
from studio import access, state, widgets

st.set_page_config(page_title="EvoPool Studio", page_icon="🧬", layout="wide")
access.require_password()  # before any page, the navigation or the sidebar (a no-op without a password)
resolve_expert_with(lambda: state.kept(state.EXPERT_NAME, ""))  # who the store records (the sidebar asks)

PAGES = [
    st.Page("pages/project.py", title="Project & data", icon=":material/folder_open:", default=True),
    st.Page("pages/evolve.py", title="Evolve", icon=":material/science:"),
    st.Page("pages/annotator.py", title="Annotator", icon=":material/code:"),
    st.Page("pages/analytics.py", title="Analytics", icon=":material/insights:"),
    st.Page("pages/teach.py", title="Label rows", icon=":material/keyboard:"),
    st.Page("pages/labels.py", title="Labels & export", icon=":material/download:"),
]

page = st.navigation(PAGES)
name = state.workspace_name()
if name and st.query_params.get(state.QP_WORKSPACE) != name:
    st.query_params[state.QP_WORKSPACE] = name  # keep the workspace in the URL on every screen
widgets.sidebar()
with widgets.frame():
    page.run()
