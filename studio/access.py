"""An optional password in front of every screen: set `EVOPOOL_PASSWORD` (or `password` in Streamlit secrets)
and the frame asks for it once per browser session before it runs any page.

The studio runs annotator code and reads server paths for whoever reaches it, so a shared machine needs this
(and a proxy with TLS beyond loopback). The password is compared in constant time and never logged or echoed;
only the fact that this session signed in is kept.
"""
from __future__ import annotations

import hmac
import os

import streamlit as st

from studio import widgets

SIGNED_IN = "evopool_signed_in"
PASSWORD_ENV = "EVOPOOL_PASSWORD"


def expected_password() -> str:
    """The configured password ("" when the studio is open): the environment wins over secrets."""
    configured = os.environ.get(PASSWORD_ENV) or widgets.secrets().get("password") or ""
    return str(configured)


def password_matches(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def require_password() -> None:
    """Stop the run with a sign-in form unless no password is set or this session has signed in."""
    expected = expected_password()
    if not expected or st.session_state.get(SIGNED_IN):
        return
    st.title(widgets.APP_NAME)
    with st.form("sign_in", clear_on_submit=True):  # cleared: the typed password does not stay in the session
        given = st.text_input("Password", type="password", key="sign_in_password")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        st.session_state.pop("sign_in_password", None)  # nothing of what was typed stays in the session
        if password_matches(given, expected):
            st.session_state[SIGNED_IN] = True
            st.rerun()
        st.error("That password is not right. Ask whoever runs this studio (it is set in EVOPOOL_PASSWORD or "
                 "the `password` secret).")
    st.stop()
