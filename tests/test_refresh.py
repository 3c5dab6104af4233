"""studio.refresh.AppRefresh: a polling fragment's app rerun never swallows the click that started the run."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _screen() -> None:
    """A polling fragment drawn above a verdict form, as on the Evolve screen; `job_ended` plays the background job
    ending while the run started by the click is under way; `use_refresh` in the session picks the studio's way or a
    plain st.rerun()."""
    import streamlit as st

    from studio.refresh import AppRefresh

    refresh_app = AppRefresh()

    @st.fragment
    def live() -> None:
        if st.session_state.get("job_ended"):
            st.session_state["job_ended"] = False
            if st.session_state["use_refresh"]:
                refresh_app()
            else:
                st.rerun(scope="app")

    live()
    refresh_app.drawn()
    with st.form("verdict"):
        note = st.text_input("Your reason (logged)")
        if st.form_submit_button("Reject"):
            st.session_state["rejected_with"] = note


def _reject_as_the_job_ends(use_refresh: bool) -> AppTest:
    at = AppTest.from_function(_screen)
    at.session_state["use_refresh"] = use_refresh
    at.run()
    at.text_input[0].input("fires on song titles")
    at.session_state["job_ended"] = True
    at.button[0].click().run()
    return at


def test_a_verdict_submitted_as_a_job_ends_is_kept():
    at = _reject_as_the_job_ends(use_refresh=True)
    assert not at.exception
    assert at.session_state["rejected_with"] == "fires on song titles"


def test_a_plain_rerun_from_the_fragment_would_have_lost_it():
    """What the studio did before: st.rerun() in the first draw ends the run early and Streamlit resets the
    click's trigger, so the form never sees it (the reason this module exists; if Streamlit ever keeps the trigger,
    this test says so)."""
    at = _reject_as_the_job_ends(use_refresh=False)
    assert not at.exception
    assert "rejected_with" not in at.session_state
