"""Rerunning the whole app from a fragment that polls a background job, without losing the expert's click.

A polling fragment is first drawn inside a full run of the page; that run may have been started by a click (a
verdict, a save). `st.rerun()` during it ends the run early, and Streamlit counts that as a finished run and resets
the click's trigger, so a form drawn further down never sees it: a verdict submitted just as a generation ended was
lost that way. So the app is rerun only from the fragment's own timed runs; the full run that first draws it goes
on, and the next tick, a second later, refreshes the app.
"""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st


class AppRefresh:
    """Call it where a polling fragment would rerun the app; call `drawn()` right after the fragment's first call in
    the full run. Before that it does nothing (the caller then draws on or returns)."""

    def __init__(self) -> None:
        self._armed = False

    def __call__(self) -> None:
        if self._armed:
            st.rerun(scope="app")

    def drawn(self) -> None:
        self._armed = True


def poll_job(draw: Callable[[AppRefresh], None], every: float | None) -> None:
    """The one way a screen follows a background job: `draw(refresh)` now, then again every `every` seconds (None: not
    again) in a fragment, where `refresh()` reruns the app once the job's end changes what the screens show."""
    refresh_app = AppRefresh()

    @st.fragment(run_every=every)
    def live() -> None:
        draw(refresh_app)

    live()
    refresh_app.drawn()
